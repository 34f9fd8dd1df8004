/* Every head's scores over training, one small chart per head laid out as the attention grid (a row per layer, a
   column per head), a line per kind of score on the same 0-to-1 scale, so that a learner sees a head turn into an
   induction head, and which one. The step the slider is at is a dark line, the phase change's head is outlined and
   its steepest rise dashed. The numbers are the timeline's (GET /api/runs/{name}/timeline): the page draws them. */

import { $, el, setLine, setupCanvas } from './dom.js';
import { fmtInt, headName } from './format.js';
import { KIND_WORDS } from './switches.js';

export const KIND_COLOURS = { previous_token: '#5b84c4', first_token: '#8a8d96', duplicate_token: '#2a9d8f',
  induction: '#b5179e', local: '#c9a227' };
const HEIGHT = 74;
const PAD = 4;
let view = null; // what the charts show: {records, kinds, phase, cursor, xAt, hidden}

/** The record a step reads: the last one at or before it (the first, before any). */
export function recordAt(records, step) {
  let found = records[0];
  for (const r of records) if (r.iter <= step) found = r;
  return found;
}

/** The scores of a head at a record as one line: 'induction 0.62 · previous-token 0.05 · ...', largest first. */
function scoresInWords(r, l, h, kinds) {
  if (!r || !r.heads) return 'no scores at this step';
  const pairs = kinds.map((k) => [k, r.heads[k][l][h]]).filter(([, v]) => v !== null);
  pairs.sort((a, b) => b[1] - a[1]);
  return pairs.map(([k, v]) => `${KIND_WORDS[k] || k} ${v.toFixed(2)}`).join(' · ');
}

/** The grid of charts for a timeline whose records score heads (n_layer x n_head of them). */
export function buildMultiples(data, nLayer, nHead, xAt) {
  const box = $('#head-multiples');
  box.textContent = '';
  const p = data.phase;
  view = { records: data.records.filter((r) => r.heads), kinds: data.kinds, phase: p, cursor: null, xAt,
    hidden: view ? view.hidden : new Set(), focus: p && p.layer !== null ? [p.layer, p.head] : [0, 0] };
  box.style.gridTemplateColumns = `max-content repeat(${nHead}, minmax(110px, 1fr))`;
  box.append(el('span', 'att-corner'));
  for (let h = 0; h < nHead; h++) box.append(el('span', 'att-head-label', `H${h}`));
  for (let l = 0; l < nLayer; l++) {
    box.append(el('span', 'att-layer-label', `L${l}`));
    for (let h = 0; h < nHead; h++) box.append(multiple(l, h));
  }
  buildLegend();
}

function multiple(l, h) {
  const fig = el('figure', 'head-multiple');
  Object.assign(fig.dataset, { layer: String(l), head: String(h) });
  const p = view.phase;
  if (p && p.formed && p.layer === l && p.head === h) fig.classList.add('phase');
  const cap = el('figcaption');
  cap.append(el('b', 'head-name', headName(l, h)), el('span', 'multiple-top'));
  fig.append(cap, el('canvas'));
  fig.addEventListener('mouseenter', () => {
    view.focus = [l, h];
    readout();
  });
  return fig;
}

/** The kinds as a legend; clicking one hides its lines (and shows them again). */
function buildLegend() {
  const legend = $('#kinds-legend');
  legend.textContent = '';
  for (const k of view.kinds) {
    const b = el('button', 'kind-key');
    b.type = 'button';
    b.dataset.kind = k;
    b.classList.toggle('hidden-kind', view.hidden.has(k));
    const sw = el('span', 'kind-swatch');
    sw.style.background = KIND_COLOURS[k] || '#444';
    b.append(sw, KIND_WORDS[k] || k);
    b.title = `show or hide the ${KIND_WORDS[k] || k} scores`;
    b.addEventListener('click', () => {
      if (view.hidden.has(k)) view.hidden.delete(k);
      else view.hidden.add(k);
      b.classList.toggle('hidden-kind', view.hidden.has(k));
      drawMultiples(view.cursor);
    });
    legend.append(b);
  }
}

/** Every chart, with the slider's step (cursor) marked and each caption naming the head's top kind there. */
export function drawMultiples(cursor) {
  if (!view) return;
  view.cursor = cursor;
  const at = recordAt(view.records, cursor);
  for (const fig of document.querySelectorAll('#head-multiples .head-multiple')) {
    const l = Number(fig.dataset.layer);
    const h = Number(fig.dataset.head);
    drawOne(fig.querySelector('canvas'), l, h);
    const top = at && at.heads ? topKind(at, l, h) : null;
    fig.querySelector('.multiple-top').textContent = top ? `${KIND_WORDS[top[0]]} ${top[1].toFixed(2)}` : '';
    fig.dataset.top = top ? top[0] : '';
    fig.title = `${headName(l, h)} at step ${fmtInt(cursor)}: ${scoresInWords(at, l, h, view.kinds)}`;
  }
  readout();
}

function topKind(r, l, h) {
  let best = null;
  for (const k of view.kinds) {
    const v = r.heads[k][l][h];
    if (v !== null && (!best || v > best[1])) best = [k, v];
  }
  return best;
}

function drawOne(canvas, l, h) {
  const W = Math.max(100, canvas.parentElement.clientWidth - 2);
  const ctx = setupCanvas(canvas, W, HEIGHT);
  ctx.fillStyle = '#fff';
  ctx.fillRect(0, 0, W, HEIGHT);
  const x = (step) => PAD + view.xAt(step) * (W - 2 * PAD);
  const y = (v) => HEIGHT - PAD - v * (HEIGHT - 2 * PAD);
  const p = view.phase;
  if (p && p.layer === l && p.head === h && p.induction_iter !== null) {
    vertical(ctx, x(p.induction_iter), KIND_COLOURS.induction, [4, 3]);
  }
  for (const k of view.kinds) {
    if (view.hidden.has(k)) continue;
    ctx.strokeStyle = KIND_COLOURS[k] || '#444';
    ctx.lineWidth = k === 'induction' ? 2 : 1.3;
    ctx.beginPath();
    let open = false;
    for (const r of view.records) {
      const v = r.heads[k][l][h];
      if (v === null) {
        open = false; // a value that is not a number: a gap
        continue;
      }
      if (open) ctx.lineTo(x(r.iter), y(v));
      else ctx.moveTo(x(r.iter), y(v));
      open = true;
    }
    ctx.stroke();
  }
  if (view.cursor !== null) vertical(ctx, x(view.cursor), '#111', []);
}

function vertical(ctx, px, colour, dash) {
  ctx.save();
  ctx.strokeStyle = colour;
  ctx.lineWidth = 1.2;
  ctx.setLineDash(dash);
  ctx.beginPath();
  ctx.moveTo(px, PAD / 2);
  ctx.lineTo(px, HEIGHT - PAD / 2);
  ctx.stroke();
  ctx.restore();
}

/** The line under the charts: the head pointed at last (at first, the phase change's) at the slider's step. */
function readout() {
  const [l, h] = view.focus;
  const at = recordAt(view.records, view.cursor);
  const step = fmtInt(at ? at.iter : view.cursor);
  setLine('#multiples-readout', `${headName(l, h)} at step ${step}: ${scoresInWords(at, l, h, view.kinds)}`);
}

export function clearMultiples() {
  view = null;
  $('#head-multiples').textContent = '';
  $('#kinds-legend').textContent = '';
  setLine('#multiples-readout', '');
}
