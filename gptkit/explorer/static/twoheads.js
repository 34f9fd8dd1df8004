/* Two heads side by side: pick any two heads and see their whole maps (POST /api/attention_map, with the parts
   switched off) next to each other, for the window around the pointed token. */

import { api } from './api.js';
import { $, setLine, setupCanvas } from './dom.js';
import { headName } from './format.js';
import { ATT_RGB, attAlpha, rgba } from './shades.js';
import { atStep, state, stepWords } from './state.js';
import { headKind, offList } from './switches.js';

const SIDES = ['a', 'b'];
let seq = 0;

/** A new run: both pickers list its heads, the first two picked. */
export function fillPairPickers(info) {
  SIDES.forEach((side, i) => {
    const sel = $(`#pair-${side}`);
    sel.textContent = '';
    for (let l = 0; l < (info.n_layer || 0); l++) {
      for (let h = 0; h < info.n_head; h++) sel.append(new Option(headName(l, h), `${l},${h}`));
    }
    sel.selectedIndex = Math.min(i, sel.options.length - 1);
  });
  clearPair();
}

export function clearPair() {
  seq++;
  for (const side of SIDES) {
    setupCanvas($(`#pair-map-${side}`), 10, 10);
    delete $(`#pair-map-${side}`).dataset.ready;
    $(`#pair-title-${side}`).textContent = '';
  }
  setLine('#pair-status', state.info && !state.info.n_layer ? 'this model has no heads' : 'Hover or click a token in the text above.');
}

/** Both maps for the pointed token's window. */
export async function refreshPair() {
  if (!state.shown || !state.info || !state.info.n_layer) return;
  const w = state.shown.window;
  const mine = ++seq;
  const heads = SIDES.map((side) => $(`#pair-${side}`).value.split(',').map(Number));
  setLine('#pair-status', 'loading the two maps…');
  let maps;
  try {
    maps = await Promise.all(heads.map(([layer, head]) => api('POST', '/api/attention_map',
      atStep({ run: state.run, ids: w.ids, layer, head, off: offList() }))));
  } catch (e) {
    if (mine === seq) setLine('#pair-status', e.message, true);
    return;
  }
  if (mine !== seq) return;
  setLine('#pair-status', '');
  SIDES.forEach((side, i) => drawSmallMap(side, heads[i], maps[i], w.position));
}

function drawSmallMap(side, [l, h], data, query) {
  const weights = data.weights || [];
  const T = weights.length;
  const room = Math.max(200, $('.pair').clientWidth / 2 - 24);
  const cell = Math.max(1, Math.min(16, Math.floor(room / Math.max(1, T))));
  const canvas = $(`#pair-map-${side}`);
  const ctx = setupCanvas(canvas, T * cell + 2, T * cell + 2);
  ctx.fillStyle = '#fff';
  ctx.fillRect(0, 0, T * cell + 2, T * cell + 2);
  for (let q = 0; q < T; q++) {
    for (let k = 0; k < T; k++) {
      if (!weights[q][k]) continue;
      ctx.fillStyle = rgba(ATT_RGB, attAlpha(weights[q][k]));
      ctx.fillRect(1 + k * cell, 1 + q * cell, cell, cell);
    }
  }
  ctx.strokeStyle = '#111';
  ctx.lineWidth = 1.5;
  ctx.strokeRect(1, 1 + query * cell, T * cell, cell);
  const kind = headKind(l, h);
  const off = offList().includes(headName(l, h)) ? ' — switched off: its output is zeroed, its weights still computed' : '';
  $(`#pair-title-${side}`).textContent = `${headName(l, h)}${kind ? ' · ' + kind : ''}${stepWords()}${off}`;
  Object.assign(canvas.dataset, { ready: '1', layer: String(l), head: String(h) });
}
