/* The picked run's loss curves (uPlot, loaded as a plain script before the modules). */

import { api, runUrl } from './api.js';
import { $, setLine } from './dom.js';
import { fmtInt } from './format.js';
import { state } from './state.js';

const HEIGHT = 220;
let metrics = null; // GET /api/runs/{name}/metrics of the picked run
let chart = null;
let xaxis = 'iter';

export async function loadMetrics(name, seq) {
  setLine('#curves-status', 'loading the curves…');
  try {
    const m = await api('GET', runUrl(name, '/metrics'));
    if (seq !== state.pickSeq) return;
    metrics = m;
    drawCurves();
  } catch (e) {
    if (seq !== state.pickSeq) return;
    metrics = null;
    destroyChart();
    setLine('#curves-status', e.message, true);
  }
}

export function setXAxis(value) {
  xaxis = value;
  drawCurves();
}

export function resizeCurves() {
  if (chart) chart.setSize({ width: chartWidth(), height: HEIGHT });
}

const chartWidth = () => Math.max(220, $('#curves').clientWidth || 300);
const present = (v) => v !== null && v !== undefined;

function destroyChart() {
  if (chart) chart.destroy();
  chart = null;
  $('#curves').textContent = '';
  delete $('#curves').dataset.last; // the last iteration drawn
}

/** uPlot's columns: the x values, then train and val loss at each (null where a series has no point). */
function lossColumns(m, x) {
  const train = Array.isArray(m.train) ? m.train : [];
  const evals = Array.isArray(m.eval) ? m.eval : [];
  // a run with no per-iteration records still has its evaluations' train loss
  const trainPoints = train.length ? train.map((r) => [r[x], r.loss]) : evals.map((r) => [r[x], r.train_loss]);
  const evalPoints = evals.map((r) => [r[x], r.val_loss]);
  const byX = new Map(); // a resumed run may log an x twice: the later record wins
  [trainPoints, evalPoints].forEach((points, series) => {
    for (const [xv, y] of points) {
      if (!present(xv) || !present(y)) continue;
      const row = byX.get(xv) || [null, null];
      row[series] = y;
      byX.set(xv, row);
    }
  });
  const xs = [...byX.keys()].sort((a, b) => a - b);
  return { data: [xs, xs.map((k) => byX.get(k)[0]), xs.map((k) => byX.get(k)[1])], perIteration: train.length > 0 };
}

function chartOptions(x) {
  const xLabel = x === 'time' ? 'time (s)' : 'iteration';
  const lossValue = (u, v) => (present(v) ? v.toFixed(4) : '—');
  const xValue = (u, v) => (!present(v) ? '—' : x === 'time' ? v.toFixed(1) + ' s' : fmtInt(v));
  return {
    width: chartWidth(),
    height: HEIGHT,
    scales: { x: { time: false } },
    cursor: { drag: { x: true, y: false, setScale: true } },
    legend: { live: true },
    series: [
      { label: xLabel, value: xValue },
      { label: 'train', stroke: '#5b84c4', width: 1, spanGaps: true, value: lossValue },
      { label: 'val', stroke: '#d9730d', width: 2, spanGaps: true, points: { show: true, size: 5, fill: '#d9730d' }, value: lossValue },
    ],
    axes: [
      { label: xLabel, labelSize: 18, size: 34 },
      { label: 'loss', labelSize: 18, size: 46 },
    ],
  };
}

function drawCurves() {
  destroyChart();
  if (!metrics) return;
  if (typeof window.uPlot !== 'function') {
    setLine('#curves-status', 'the chart library (static/vendor/uPlot.iife.min.js) did not load', true);
    return;
  }
  const { data, perIteration } = lossColumns(metrics, xaxis);
  if (!data[0].length) {
    setLine('#curves-status', metrics.note || 'this run has logged no losses yet');
    return;
  }
  chart = new window.uPlot(chartOptions(xaxis), data, $('#curves'));
  const iters = lossColumns(metrics, 'iter').data[0];
  $('#curves').dataset.last = String(iters[iters.length - 1]); // how far the curves reach, whatever the x axis
  setLine('#curves-status', perIteration ? '' : 'no per-iteration records: train is the evaluations\' train loss');
}
