/* The lab's runs on one chart (GET /api/lab): the val-loss curve of every rung of the attention lab in the
   folder (a run folder with the lab's lab.json), against iterations, in the lab's order. */

import { api } from './api.js';
import { $, setLine } from './dom.js';
import { fmtInt } from './format.js';

const HEIGHT = 240;
const COLOURS = ['#8a8d96', '#5b84c4', '#d9730d', '#2a9d8f', '#b5179e', '#4b3fa8', '#e63946', '#2b2d42', '#c9a227'];
let chart = null;

export async function loadLab() {
  let data;
  try {
    data = await api('GET', '/api/lab');
  } catch (e) {
    setLine('#lab-status', e.message, true);
    return;
  }
  const runs = (data && Array.isArray(data.runs) ? data.runs : []).filter((r) => r && Array.isArray(r.eval));
  $('#lab-card').hidden = !runs.length;
  if (chart) chart.destroy();
  chart = null;
  $('#lab-curves').textContent = '';
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
