/* One head's map: every token of the window as a query (rows, down) against every token as a key (columns,
   across), from POST /api/attention_map. Rows and columns are labelled with their tokens when those fit,
   otherwise with token numbers at intervals. */

import { api } from './api.js';
import { $, monoFont, setLine, setupCanvas, textWidth } from './dom.js';
import { fmtP, headName, quote, tokenNumber } from './format.js';
import { ATT_RGB, attAlpha, rgba } from './shades.js';
import { clearScores, loadScores } from './scores.js';
import { atStep, state, stepWords } from './state.js';
import { offList } from './switches.js';

const MIN_CELL = 2;
const MAX_CELL = 26;
const TOKEN_TICKS_CELL = 10; // the smallest square whose row and column can carry a token's text
const MAX_LABEL_PX = 100; // a long token's label is cut to this
const NUMBER_SPACING_PX = 26; // between two numbered rows or columns, when tokens do not fit
const STRIDES = [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000];
const INK = '#23252b';
let mapSeq = 0; // counts requests, so that an answer for an earlier head is dropped
let map = null; // the drawn map's geometry and numbers, for the hover readout

export function clearMap() {
  mapSeq++;
  map = null;
  state.selectedHead = null;
  clearScores();
  const canvas = $('#attention-map');
  delete canvas.dataset.ready;
  delete canvas.dataset.ticks;
  setupCanvas(canvas, 10, 10);
  showAxes(false);
  $('#map-title').textContent = "One head's map: click a cell above";
  setLine('#map-readout', '');
  setLine('#map-status', '');
}

function showAxes(on) {
  for (const id of ['#map-key-axis', '#map-query-axis']) $(id).hidden = !on;
}

function selectCell(l, h) {
  state.selectedHead = { layer: l, head: h };
  for (const c of document.querySelectorAll('#attention .head-cell')) {
    c.classList.toggle('selected', Number(c.dataset.layer) === l && Number(c.dataset.head) === h);
  }
}

/** The pinned token changed: the selected head's map is fetched again for its window. */
export function refreshMapFor(i) {
  const sel = state.selectedHead;
  if (!sel || !state.shown || state.shown.index !== i) return;
  if (map && map.idsKey === state.shown.idsKey && map.layer === sel.layer && map.head === sel.head) return;
  loadMap(sel.layer, sel.head);
}

export async function loadMap(l, h) {
  if (!state.shown) return;
  selectCell(l, h);
  const { window: w, idsKey } = state.shown;
  const seq = ++mapSeq;
  delete $('#attention-map').dataset.ready;
  setLine('#map-status', `loading ${headName(l, h)}…`);
  let data;
  try {
    data = await api('POST', '/api/attention_map',
      atStep({ run: state.run, ids: w.ids, layer: l, head: h, off: offList() }));
  } catch (e) {
    if (seq === mapSeq) setLine('#map-status', e.message, true);
    return;
  }
  if (seq !== mapSeq) return;
  setLine('#map-status', '');
  drawMap(data, l, h, w, idsKey);
  loadScores(l, h);
}

/** Square size and margins: token labels when a square is big enough to carry one, else numbers. */
function mapGeometry(labels) {
  const T = labels.length;
  const avail = Math.max(360, $('.map-scroll').clientWidth - 12);
  const cell = Math.max(MIN_CELL, Math.min(MAX_CELL, Math.floor((avail - MAX_LABEL_PX) / T)));
  const tokens = cell >= TOKEN_TICKS_CELL;
  const font = monoFont(cell >= 14 ? 12 : 10);
  let margin = 36; // room for a four-digit token number
  if (tokens) margin = Math.min(MAX_LABEL_PX, 8 + Math.max(0, ...labels.map((lab) => Math.ceil(textWidth(lab, font)))));
  const stride = tokens ? 1 : STRIDES.find((s) => s * cell >= NUMBER_SPACING_PX) || STRIDES[STRIDES.length - 1];
  return { T, cell, tokens, font, stride, left: margin, top: tokens ? margin : 20, size: T * cell };
}

function paintWeights(ctx, g, weights, query) {
  for (let q = 0; q < g.T; q++) {
    const row = weights[q] || [];
    for (let k = 0; k < g.T; k++) {
      if (!row[k]) continue; // a weight of 0 (a future token, for a causal model) stays white
      ctx.fillStyle = rgba(ATT_RGB, attAlpha(row[k]));
      ctx.fillRect(g.left + k * g.cell, g.top + q * g.cell, g.cell, g.cell);
    }
  }
  ctx.strokeStyle = '#c9c5bc';
  ctx.lineWidth = 1;
  ctx.strokeRect(g.left - 0.5, g.top - 0.5, g.size + 1, g.size + 1);
  if (query >= 0 && query < g.T) {
    ctx.strokeStyle = '#111';
    ctx.lineWidth = 2;
    ctx.strokeRect(g.left - 1, g.top + query * g.cell - 1, g.size + 2, g.cell + 2);
  }
}

/** Each row's and column's token, the columns' written upwards so that they fit their width. */
function paintTokenTicks(ctx, g, labels) {
  ctx.textAlign = 'right';
  for (let q = 0; q < g.T; q++) ctx.fillText(labels[q] || '', g.left - 4, g.top + q * g.cell + g.cell / 2, g.left - 6);
  for (let k = 0; k < g.T; k++) {
    ctx.save();
    ctx.translate(g.left + k * g.cell + g.cell / 2, g.top - 4);
    ctx.rotate(-Math.PI / 2);
    ctx.textAlign = 'left';
    ctx.fillText(labels[k] || '', 0, 0, g.top - 6);
    ctx.restore();
  }
}

/** Token numbers (counted from 1 along the text, as everywhere on the page) at every stride-th row and column,
    each with a tick. */
function paintNumberTicks(ctx, g, start) {
  ctx.strokeStyle = '#8a8d96';
  ctx.lineWidth = 1;
  ctx.beginPath();
  for (let j = 0; j < g.T; j++) {
    const n = start + j + 1;
    if (n % g.stride !== 0) continue;
    const mid = j * g.cell + g.cell / 2;
    ctx.textAlign = 'right';
    ctx.fillText(String(n), g.left - 6, g.top + mid);
    ctx.moveTo(g.left - 4, g.top + mid);
    ctx.lineTo(g.left - 1, g.top + mid);
    ctx.textAlign = 'center';
    ctx.fillText(String(n), g.left + mid, g.top - 10);
    ctx.moveTo(g.left + mid, g.top - 4);
    ctx.lineTo(g.left + mid, g.top - 1);
  }
  ctx.stroke();
}

function drawMap(data, l, h, w, idsKey) {
  const weights = Array.isArray(data.weights) ? data.weights : [];
  const labels = Array.isArray(data.labels) ? data.labels : [];
  const canvas = $('#attention-map');
  const pinned = `${quote(labels[w.position] || '')}, ${tokenNumber(w.start + w.position)}`;
  $('#map-title').textContent = `${headName(l, h)} (layer ${l}, head ${h})${stepWords()}: row by row, how much ` +
    `each token (the query) weighs each token it may look at (the keys); the outlined row is ${pinned}`;
  if (!weights.length) return setLine('#map-status', 'the map is empty');
  const g = mapGeometry(labels);
  const ctx = setupCanvas(canvas, g.left + g.size + 6, g.top + g.size + 6);
  ctx.fillStyle = '#fff';
  ctx.fillRect(0, 0, g.left + g.size + 6, g.top + g.size + 6);
  paintWeights(ctx, g, weights, w.position);
  ctx.font = g.font;
  ctx.fillStyle = INK;
  ctx.textBaseline = 'middle';
  if (g.tokens) paintTokenTicks(ctx, g, labels);
  else paintNumberTicks(ctx, g, w.start);
  showAxes(true);
  map = { ...g, weights, labels, start: w.start, layer: l, head: h, idsKey };
  const ticks = g.tokens ? 'tokens' : `every ${g.stride}`;
  Object.assign(canvas.dataset, { ready: '1', layer: String(l), head: String(h), ticks });
  setLine('#map-readout', g.tokens ? 'Point at a square for its weight.'
    : `Too many tokens to write them all: every ${g.stride}th is numbered; point at a square for its tokens and weight.`);
}

export function mapHover(ev) {
  if (!map) return;
  const r = ev.target.getBoundingClientRect();
  const k = Math.floor((ev.clientX - r.left - map.left) / map.cell);
  const q = Math.floor((ev.clientY - r.top - map.top) / map.cell);
  if (q < 0 || k < 0 || q >= map.T || k >= map.T) return;
  const token = (j) => `${quote(map.labels[j])} (${tokenNumber(map.start + j)})`;
  setLine('#map-readout', `${headName(map.layer, map.head)}: query ${token(q)} → key ${token(k)}: ${fmtP((map.weights[q] || [])[k])}`);
}
