/* Before and after the softmax: for the pointed token and the head whose map is open, q·k for every token it
   may look at, raw and scaled by 1/√d, beside the weights after the softmax (POST /api/scores), and what the
   weights would be without the scale, so the learner sees what the scale does. */

import { api } from './api.js';
import { $, el, setLine } from './dom.js';
import { fmtP, headName, quote, tokenNumber } from './format.js';
import { ATT_RGB, attAlpha, shade } from './shades.js';
import { atStep, state } from './state.js';
import { offList } from './switches.js';

let seq = 0;

export function clearScores() {
  seq++;
  $('#scores').textContent = '';
  setLine('#scores-status', '');
}

export async function loadScores(l, h) {
  if (!state.shown) return;
  const w = state.shown.window;
  const mine = ++seq;
  let data;
  try {
    data = await api('POST', '/api/scores', atStep({ run: state.run, ids: w.ids, position: w.position, layer: l, head: h,
      off: offList() }));
  } catch (e) {
    if (mine === seq) setLine('#scores-status', e.message, true);
    return;
  }
  if (mine !== seq) return;
  setLine('#scores-status', '');
  drawScores(data, w);
}

const num = (x) => (x === null || x === undefined ? '—' : x.toFixed(3));

function drawScores(data, w) {
  const box = $('#scores');
  box.textContent = '';
  const labels = state.chips.slice(w.start, w.end).map((c) => c.label);
  const scale = data.scale ? `1/√${data.d_head} = ${data.scale.toFixed(4)}` : 'no scale (keys of no width)';
  const how = { scaled: 'this model softmaxes the scaled scores', dot: 'this model softmaxes the raw scores (no scale)',
    uniform: 'uniform attention: every score is 0', additive: 'additive attention softmaxes v·tanh(q+k), not q·k' }[data.attention] || '';
  box.append(el('p', 'scores-title', `${headName(data.layer, data.head)} at ${quote(labels[w.position] || '')} ` +
    `(${tokenNumber(w.start + w.position)}): q·k before the softmax, raw and times ${scale}; ${how}.`));
  const table = el('table', 'scores-table');
  const head = el('tr');
  for (const t of ['key', 'q·k', 'q·k / √d', 'weight after the softmax', 'softmax(q·k), no scale']) head.append(el('th', null, t));
  table.append(head);
  // a key the mask hides has no score: only the keys the token may look at get a row
  for (const j of data.raw.keys()) {
    if (data.raw[j] === null) continue;
    const tr = el('tr');
    tr.dataset.key = String(j);
    if (j === w.position) tr.classList.add('query');
    const weight = el('td', 'w', fmtP(data.weights[j]));
    shade(weight, ATT_RGB, attAlpha(data.weights[j]));
    const flat = el('td', 'w', fmtP(data.weights_unscaled[j]));
    shade(flat, ATT_RGB, attAlpha(data.weights_unscaled[j]));
    tr.append(el('td', 'k', `${quote(labels[j] || '')} ${tokenNumber(w.start + j)}`), el('td', 'n raw', num(data.raw[j])),
      el('td', 'n scaled', num(data.scaled[j])), weight, flat);
    table.append(tr);
  }
  const scroll = el('div', 'scores-scroll');
  scroll.append(table);
  box.append(scroll);
  box.dataset.ready = '1';
}
