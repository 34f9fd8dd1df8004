/* Where it looked: for the pointed token, one cell per layer (rows) and head (columns). Every cell shows the
   same short strip of the text (two lines), the tokens nearest the pointed one that it may attend to, each
   shaded by that head's weight on it; the weight on tokens too far away to fit is summed into a "…" box at
   the end of the strip. Each cell also names the token its head weighs most ("top"). Click a cell for the
   head's whole map. */

import { $, el, monoFont, setLine, textWidth } from './dom.js';
import { fmtP, headName, quote, tokenNumber } from './format.js';
import { loadMap } from './headmap.js';
import { ATT_RGB, attAlpha, shade } from './shades.js';
import { state } from './state.js';
import { headKind, isOff } from './switches.js';

const STRIP_FONT_PX = 13; // .strip in the stylesheet
const STRIP_LINES = 2; // .strip's height in the stylesheet
const TOKEN_EXTRA_PX = 4; // a token's padding and gap in .strip .tok, and a pixel to spare
const MORE_PX = 20; // a "…" box, .strip .more
let drawn = null; // what the strips show, for the hover readout: {labels, start, query, rows}

export function clearAttention() {
  drawn = null;
  $('#attention').style.gridTemplateColumns = '';
  $('#attention-note').hidden = true;
  setLine('#attention-readout', '');
}

/** Draw the grid again at the page's new width: the strips hold as many tokens as fit. */
export function redrawAttention() {
  if (state.shown && $('#attention').dataset.ready) renderAttention(state.shown.index, state.shown.window, state.shown.data);
}

export function renderAttention(i, w, data) {
  const att = data.attention || {};
  const grid = $('#attention');
  const note = $('#attention-note');
  note.hidden = !att.note;
  note.textContent = att.note || '';
  note.classList.toggle('cheat', Boolean(state.info && state.info.causal === false));
  grid.textContent = '';
  setLine('#attention-readout', '');
  const L = att.layers || 0;
  const H = att.heads || 0;
  const rows = Array.isArray(att.rows) ? att.rows : [];
  if (!L || !H || !rows.length) {
    grid.style.gridTemplateColumns = '';
    grid.append(el('p', 'placeholder', 'This model has no attention layers to show.'));
    drawn = null;
  } else {
    const labels = state.chips.slice(w.start, w.end).map((c) => c.label);
    drawn = { labels, start: w.start, query: w.position, rows };
    const cells = buildGrid(grid, L, H);
    const range = stripRange(labels, w.position, cells[0].querySelector('.strip').clientWidth, state.info && state.info.causal === false);
    for (const cell of cells) fillCell(cell, range);
  }
  grid.dataset.ready = '1';
  grid.dataset.index = String(i);
}

/** The grid's frame: head names across, layer names down, and an empty cell per head. */
function buildGrid(grid, L, H) {
  grid.style.gridTemplateColumns = `max-content repeat(${H}, minmax(${H > 4 ? 120 : 160}px, 1fr))`;
  grid.append(el('span', 'att-corner'));
  for (let h = 0; h < H; h++) grid.append(labelled('span', 'att-head-label', `H${h}`, `head ${h}`));
  const cells = [];
  for (let l = 0; l < L; l++) {
    grid.append(labelled('span', 'att-layer-label', `L${l}`, `layer ${l}`));
    for (let h = 0; h < H; h++) {
      const cell = el('button', 'head-cell');
      cell.type = 'button';
      cell.dataset.layer = String(l);
      cell.dataset.head = String(h);
      const sel = state.selectedHead;
      if (sel && sel.layer === l && sel.head === h) cell.classList.add('selected');
      if (isOff(headName(l, h))) cell.classList.add('off');
      const top = el('span', 'head-top');
      top.append(el('b', 'head-name', headName(l, h)), el('span', 'head-kind', headKind(l, h)), el('span', 'head-max'));
      cell.append(top, el('span', 'strip'));
      grid.append(cell);
      cells.push(cell);
    }
  }
  return cells;
}

function labelled(tag, cls, text, title) {
  const e = el(tag, cls, text);
  e.title = title;
  return e;
}

/** Which tokens fit in a strip `room` pixels wide and STRIP_LINES lines high: the pointed token (key q) and its
    neighbours, before it and, for a model that is not causal (ahead), after it too; a side with tokens left
    over keeps room for its "…". A causal model's tokens after q get no weight, so its strip ends at q. */
function stripRange(labels, q, room, ahead) {
  const font = monoFont(STRIP_FONT_PX);
  const T = labels.length;
  const fits = (first, last) => {
    const widths = first > 0 ? [MORE_PX] : [];
    for (let j = first; j <= last; j++) widths.push(Math.ceil(textWidth(labels[j], font)) + TOKEN_EXTRA_PX);
    if (ahead && last < T - 1) widths.push(MORE_PX);
    return linesNeeded(widths, room) <= STRIP_LINES;
  };
  let first = q;
  let last = q;
  for (let grew = true; grew;) {
    grew = false;
    if (first > 0 && fits(first - 1, last)) {
      first--;
      grew = true;
    }
    if (ahead && last < T - 1 && fits(first, last + 1)) {
      last++;
      grew = true;
    }
  }
  return { first, last, ahead };
}

/** How many lines boxes of these widths fill when they wrap as words do. */
function linesNeeded(widths, room) {
  let lines = 1;
  let x = 0;
  for (const w of widths) {
    if (x > 0 && x + w > room) {
      lines++;
      x = 0;
    }
    x += w;
  }
  return lines;
}

function fillCell(cell, range) {
  const { labels, query } = drawn;
  const weights = weightsOf(drawn.rows, cell);
  const strip = cell.querySelector('.strip');
  if (range.first > 0) strip.append(moreBox(weights, 0, range.first, 'before'));
  for (let j = range.first; j <= range.last; j++) {
    const tok = el('span', 'tok', labels[j]);
    tok.dataset.key = String(j);
    shade(tok, ATT_RGB, attAlpha(weights[j]));
    if (j === query) tok.classList.add('query');
    strip.append(tok);
  }
  if (range.ahead && range.last < labels.length - 1) strip.append(moreBox(weights, range.last + 1, labels.length, 'after'));
  const l = Number(cell.dataset.layer);
  const h = Number(cell.dataset.head);
  const best = argmax(weights);
  const top = best < 0 ? null : `${quote(labels[best])} ${fmtP(weights[best])}`;
  cell.querySelector('.head-max').textContent = top ? 'top ' + top : '';
  const most = top ? `; it weighs ${top} most (${distance(best, query)})` : '';
  cell.title = `${headName(l, h)} = layer ${l}, head ${h}${most}. Click to open its whole map below.`;
  cell.setAttribute('aria-label', cell.title);
}

/** The tokens from..to-1, too far away to fit: one box shaded by their weight together. */
function moreBox(weights, from, to, side) {
  let sum = 0;
  for (let j = from; j < to; j++) sum += weights[j] || 0;
  const box = el('span', 'more', '…');
  box.dataset.from = String(from);
  box.dataset.to = String(to);
  box.dataset.side = side;
  box.dataset.weight = String(sum);
  shade(box, ATT_RGB, attAlpha(sum));
  return box;
}

/** A cell's head's weights, one per key, from the API's rows[layer][head]. */
function weightsOf(rows, cell) {
  const layer = rows[Number(cell.dataset.layer)];
  return (layer && layer[Number(cell.dataset.head)]) || [];
}

function argmax(xs) {
  let best = -1;
  for (let j = 0; j < xs.length; j++) if (best < 0 || xs[j] > xs[best]) best = j;
  return best;
}

function distance(key, query) {
  if (key === query) return 'itself';
  return key < query ? `${query - key} back` : `${key - query} ahead`;
}

/** The pointer over a strip: which token of which head, and its weight, in the line under the grid. */
export function attentionHover(ev) {
  const cell = ev.target.closest('.head-cell');
  if (!cell || !drawn) return;
  const l = Number(cell.dataset.layer);
  const h = Number(cell.dataset.head);
  const from = `${headName(l, h)}: ${quote(drawn.labels[drawn.query])} (${tokenNumber(drawn.start + drawn.query)})`;
  const tok = ev.target.closest('.tok');
  const more = ev.target.closest('.more');
  if (tok) {
    const j = Number(tok.dataset.key);
    const w = weightsOf(drawn.rows, cell)[j];
    setLine('#attention-readout', `${from} → ${quote(drawn.labels[j])} (${tokenNumber(drawn.start + j)}): ${fmtP(w)}`);
  } else if (more) {
    const n = Number(more.dataset.to) - Number(more.dataset.from);
    const weight = fmtP(Number(more.dataset.weight));
    setLine('#attention-readout', `${from} → the ${n} tokens ${more.dataset.side} the strip, together: ${weight}`);
  } else {
    setLine('#attention-readout', `${headName(l, h)} (layer ${l}, head ${h}): click to open its whole map`);
  }
}

export function attentionClick(ev) {
  const cell = ev.target.closest('.head-cell');
  if (cell) loadMap(Number(cell.dataset.layer), Number(cell.dataset.head));
}
