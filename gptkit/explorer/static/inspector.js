/* The token the learner points at (hovered, or clicked to pin it): one POST /api/position for it, drawn by
   the three panels below the text: why this token, where it looked, and the logit lens; at the weights the Over
   training slider picked (state.checkpoint), if it picked a snapshot. */

import { api } from './api.js';
import { $, placeholder, setLine } from './dom.js';
import { clearAttention, renderAttention } from './attention.js';
import { clearMap, refreshMapFor } from './headmap.js';
import { readKnobs } from './knobs.js';
import { renderLens } from './lens.js';
import { clearPair, refreshPair } from './twoheads.js';
import { answeredOff, offList } from './switches.js';
import { atStep, state } from './state.js';
import { renderWhy } from './why.js';

const HOVER_MS = 120; // a pointer crossing the text asks only for the token it rests on
const KNOB_MS = 160; // a dragged slider asks once it pauses
const CACHE_SIZE = 60; // answers kept, so that going back to a token is instant
const cache = new Map();
let posSeq = 0; // counts requests, so that an answer for an earlier token is dropped
let hoverTimer = 0;
let knobTimer = 0;

/** Forget the pointed token (a new text, or a new run) and empty the panels. */
export function clearInspector() {
  state.pinned = null;
  state.shown = null;
  posSeq++;
  cache.clear(); // the run may have been loaded again since, its checkpoint replaced: the same text, other numbers
  for (const id of ['#why', '#attention', '#lens']) {
    const node = $(id);
    delete node.dataset.ready;
    delete node.dataset.index;
    placeholder(node, 'Hover or click a token in the text above.');
  }
  $('#why-head').textContent = '';
  $('#why-note').hidden = true;
  for (const s of ['#why-status', '#attention-status', '#lens-status']) setLine(s, '');
  clearAttention();
  clearMap();
  clearPair(); // the two heads' maps are of the pointed token's window too
}

export function pin(i) {
  if (i < 0 || i >= state.chips.length) return;
  clearTimeout(hoverTimer);
  state.pinned = i;
  markChips();
  requestPosition(i);
}

export function hoverToken(i) {
  clearTimeout(hoverTimer);
  if (state.shown && state.shown.index === i) return;
  hoverTimer = setTimeout(() => requestPosition(i), HOVER_MS);
}

/** The pointer left the text: the panels go back to the pinned token. */
export function leaveText() {
  clearTimeout(hoverTimer);
  if (state.pinned !== null && (!state.shown || state.shown.index !== state.pinned)) requestPosition(state.pinned);
}

/** A knob moved: the shown token's candidates are fetched again with the new knobs. */
export function knobsChanged() {
  clearTimeout(knobTimer);
  knobTimer = setTimeout(() => {
    const i = state.pinned !== null ? state.pinned : state.shown ? state.shown.index : null;
    if (i !== null) requestPosition(i);
  }, KNOB_MS);
}

function chipNode(i) {
  return i === null || i === undefined ? null : $(`#output .chip[data-index="${i}"]`);
}

function markChips() {
  for (const c of document.querySelectorAll('#output .chip.pinned, #output .chip.shown')) c.classList.remove('pinned', 'shown');
  const p = chipNode(state.pinned);
  if (p) p.classList.add('pinned');
  const s = state.shown ? chipNode(state.shown.index) : null;
  if (s && s !== p) s.classList.add('shown');
}

/** The window the model reads around token i of the token ids allIds: at most block_size tokens, as many of
    them before i as fit, then the ones after it (a causal model's numbers at i do not depend on them; an
    encoder's do, and the attention panel shows it looking ahead). */
export function windowOf(allIds, i) {
  const block = state.info && state.info.block_size ? state.info.block_size : Infinity;
  const start = Math.max(0, i + 1 - block);
  const end = Math.min(allIds.length, start + block);
  return { start, end, ids: allIds.slice(start, end), position: i - start };
}

const windowFor = (i) => windowOf(state.chips.map((c) => c.id), i);

function cacheGet(key) {
  if (!cache.has(key)) return undefined;
  const v = cache.get(key);
  cache.delete(key); // and back in at the end: the least recently used answer goes first
  cache.set(key, v);
  return v;
}

function cachePut(key, v) {
  cache.set(key, v);
  while (cache.size > CACHE_SIZE) cache.delete(cache.keys().next().value);
}

/** POST /api/position (or its cached answer); null when it failed, said so, or was overtaken. */
async function positionData(body, key, seq, statuses) {
  const cached = cacheGet(key);
  if (cached !== undefined) return cached;
  const slow = setTimeout(() => {
    if (seq === posSeq) setLine('#why-status', 'asking the model…');
  }, 150);
  try {
    const data = await api('POST', '/api/position', body);
    cachePut(key, data);
    return data;
  } catch (e) {
    if (seq === posSeq) for (const s of statuses) setLine(s, e.message, true);
    return null;
  } finally {
    clearTimeout(slow);
  }
}

/** Fetch what the model computes at token i and draw the three panels. */
export async function requestPosition(i) {
  if (!state.run || i === null || i < 0 || i >= state.chips.length) return;
  const knobs = readKnobs();
  if (knobs.error) return setLine('#why-status', knobs.error, true);
  const w = windowFor(i);
  const body = atStep({ run: state.run, ids: w.ids, position: w.position, ...knobs, k: 10, off: offList() });
  const key = JSON.stringify(body);
  // parts off, and other weights, change every panel
  const idsKey = JSON.stringify([state.run, w.ids, w.position, state.off, state.checkpoint]);
  const shown = state.shown;
  if (shown && shown.key === key && shown.index === i) {
    markChips();
    if (state.pinned === i) refreshMapFor(i);
    return;
  }
  // only the knobs changed: attention and the lens do not depend on them, so they stay as drawn
  const sameToken = Boolean(shown && shown.index === i && shown.idsKey === idsKey);
  const seq = ++posSeq;
  for (const id of sameToken ? ['#why'] : ['#why', '#attention', '#lens']) delete $(id).dataset.ready;
  const data = await positionData(body, key, seq, sameToken ? ['#why-status'] : ['#why-status', '#attention-status', '#lens-status']);
  if (data === null || seq !== posSeq) return;
  state.shown = { index: i, idsKey, key, window: w, data };
  markChips();
  setLine('#why-status', '');
  renderWhy(i, w, data, knobs);
  answeredOff(data.off);
  if (!sameToken) {
    refreshPair();
    setLine('#attention-status', '');
    setLine('#lens-status', '');
    renderAttention(i, w, data);
    $('#attention').dataset.checkpoint = body.checkpoint || '';
    renderLens(i, data);
  }
  if (state.pinned === i) refreshMapFor(i);
}
