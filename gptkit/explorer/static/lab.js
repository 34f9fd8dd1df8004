/* The lab's runs on one chart (GET /api/lab): the val-loss curve of every rung of the attention lab in the
   folder (a run folder with the lab's lab.json), against iterations, in the lab's order; and under it each
   rung's final score as the lab's table has it, in nats per token and in bits per character. */

import { api } from './api.js';
import { $, el, setLine } from './dom.js';
import { fmtInt } from './format.js';

const HEIGHT = 240;
const COLOURS = ['#8a8d96', '#5b84c4', '#d9730d', '#2a9d8f', '#b5179e', '#4b3fa8', '#e63946', '#2b2d42', '#c9a227'];
let chart = null;
let asked = 0; // the lab asked for last: an answer to an earlier ask, come later, is the folder as it was

export async function loadLab() {
  const ask = ++asked;
  let data;
  try {
    data = await api('GET', '/api/lab');
  } catch (e) {
    if (ask === asked) setLine('#lab-status', e.message, true);
    return;
  }
  if (ask !== asked) return;
  const runs = (data && Array.isArray(data.runs) ? data.runs : []).filter((r) => r && Array.isArray(r.eval));
  $('#lab-card').hidden = !runs.length;
  if (chart) chart.destroy();
  chart = null;
  $('#lab-curves').textContent = '';
  finalTable(runs);
  if (!runs.length || typeof window.uPlot !== 'function') return;
  const xs = [...new Set(runs.flatMap((r) => r.eval.map((e) => e.iter)))].sort((a, b) => a - b);
  const columns = runs.map((r) => {
    const at = new Map(r.eval.map((e) => [e.iter, e.val_loss]));
    return xs.map((x) => (at.has(x) ? at.get(x) : null));
  });
  const lossValue = (u, v) => (v === null || v === undefined ? '—' : v.toFixed(4));
  const series = [{ label: 'iteration', value: (u, v) => fmtInt(v) }, ...runs.map((r, i) => ({
    label: r.rung && r.rung.cheats ? `${r.name} (cheats)` : r.name,
    stroke: COLOURS[i % COLOURS.length],
    width: 2,
    spanGaps: true,
    value: lossValue,
  }))];
  const width = Math.max(220, $('#lab-curves').clientWidth || 300);
  chart = new window.uPlot({ width, height: HEIGHT, scales: { x: { time: false } }, series, legend: { live: true },
    axes: [{ label: 'iteration', labelSize: 18, size: 34 }, { label: 'val loss', labelSize: 18, size: 46 }] },
  [xs, ...columns], $('#lab-curves'));
  const broken = runs.filter((r) => r.error).map((r) => `${r.name}: ${r.error}`);
  setLine('#lab-status', broken.join('; '), broken.length > 0);
}

const fixed = (x, digits) => (x === null || x === undefined || !Number.isFinite(x) ? '—' : x.toFixed(digits));

/** Each rung's final score: val loss on the whole val split (nats per token) and bits per character, '—' for a
    rung not finished or whose dataset was prepared before its characters were counted. */
function finalTable(runs) {
  const box = $('#lab-table');
  box.textContent = '';
  if (!runs.length) return;
  const table = el('table', 'lab-table');
  const head = el('tr');
  for (const h of ['rung', 'val loss (nats per token)', 'bits per character']) head.append(el('th', null, h));
  table.append(el('thead'), el('tbody'));
  table.tHead.append(head);
  for (const r of runs) {
    const f = r.final || {};
    const row = el('tr');
    row.dataset.name = r.name;
    row.append(el('td', null, r.rung && r.rung.cheats ? `${r.name} (cheats)` : r.name),
      el('td', 'num', fixed(f.val_loss, 3)), el('td', 'num', fixed(f.bits_per_char, 3)));
    table.tBodies[0].append(row);
  }
  box.append(table);
}
