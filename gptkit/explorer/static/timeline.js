/* Over training: the picked run's timeline (GET /api/runs/{name}/timeline, gptkit/explorer/timeline_answers.py): its
   val loss and in-context learning score at every recorded step (uPlot), every head's scores (multiples.js), where the
   phase change happened, and a slider over the steps. Where the run keeps snapshots (train.py --snapshots=N) the slider
   snaps to their steps and moves the panels that read the model to that step's weights: state.checkpoint ('iter:N')
   goes with their requests (state.js's atStep) until "the run's own weights" takes it back. Without snapshots the
   slider moves over every record, and only the curves follow it. */

import { api, runUrl } from './api.js';
import { $, setLine } from './dom.js';
import { fmtInt, headName } from './format.js';
import { KIND_COLOURS, buildMultiples, clearMultiples, drawMultiples, recordAt } from './multiples.js';
import { state } from './state.js';

const HEIGHT = 220;
const STEP_MS = 150; // a dragged slider asks for a step's weights once it pauses
const ICL_COLOUR = '#4b3fa8';
const SLIDERS = ['#step-range', '#step-range-mini'];
let data = null; // the picked run's timeline
let steps = []; // the slider's steps: the snapshots' where the run keeps some, else every record's
let cursor = null; // the step the charts mark
let chart = null;
let logX = true;
let stepTimer = 0;
let changed = () => {}; // what the panels do when the weights they read change (explorer.js wires it)

export function onCheckpointChange(fn) {
  changed = fn;
}

/** A run picked: the run's own weights, and nothing shown until its timeline comes. */
export function clearTimeline() {
  clearTimeout(stepTimer);
  state.checkpoint = null;
  data = null;
  steps = [];
  cursor = null;
  if (chart) chart.destroy();
  chart = null;
  $('#timeline-curves').textContent = '';
  clearMultiples();
  $('#timeline-body').hidden = true;
  $('#timeline-note').hidden = true;
  $('#step-banner').hidden = true;
  for (const id of ['#phase-line', '#timeline-readout', '#timeline-status']) setLine(id, '');
  delete $('#timeline-card').dataset.ready;
}

export async function loadTimeline(name, seq) {
  setLine('#timeline-status', 'loading the timeline…');
  try {
    const got = await api('GET', runUrl(name, '/timeline'));
    if (seq !== state.pickSeq) return;
    data = got;
    setLine('#timeline-status', '');
    render();
  } catch (e) {
    if (seq === state.pickSeq) setLine('#timeline-status', e.message, true);
  }
}

function render() {
  const note = $('#timeline-note');
  note.hidden = !data.note;
  note.textContent = data.note || '';
  steps = data.snapshots.length ? data.snapshots : data.records.map((r) => r.iter);
  $('#timeline-body').hidden = !steps.length;
  $('#timeline-card').dataset.ready = '1';
  if (!steps.length) return;
  cursor = keptReading();
  for (const id of SLIDERS) Object.assign($(id), { min: '0', max: String(steps.length - 1) });
  placeSliders();
  $('#timeline-charts').hidden = !data.records.length;
  drawChart();
  const scored = data.records.find((r) => r.heads);
  $('#multiples-box').hidden = !scored;
  if (scored) buildMultiples(data, scored.heads.induction.length, scored.heads.induction[0].length, xAt);
  setLine('#phase-line', phaseInWords(data.phase));
  showStep();
}

/** Where the slider goes as the timeline comes: the run's own step; loaded again (the run logged more), the
    snapshot the panels read while the run still keeps it (a run still training thins its snapshots), else back to
    the run's own weights, the panels with it. */
function keptReading() {
  if (!state.checkpoint) return ownStep();
  const reading = Number(state.checkpoint.slice(5));
  if (data.snapshots.includes(reading)) return reading;
  state.checkpoint = null;
  setLine('#timeline-status', `the run no longer keeps step ${fmtInt(reading)}: back to its own weights`);
  setTimeout(changed); // once the timeline is drawn
  return ownStep();
}

/** The step of the run's own weights (its checkpoint's, where it says), else the last recorded. */
function ownStep() {
  return data.own.iter !== null ? data.own.iter : steps[steps.length - 1];
}

/** The slider's position for a step: the last of its steps at or before it. */
function indexOf(step) {
  let found = 0;
  steps.forEach((s, i) => {
    if (s <= step) found = i;
  });
  return found;
}

function placeSliders() {
  for (const id of SLIDERS) $(id).value = String(indexOf(cursor));
}

/** Slider position i: its step marked; with snapshots, the panels read that step's weights once it pauses. */
export function slideTo(i) {
  for (const id of SLIDERS) $(id).value = String(i);
  cursor = steps[i];
  if (data.snapshots.length) {
    state.checkpoint = `iter:${cursor}`;
    clearTimeout(stepTimer);
    stepTimer = setTimeout(changed, STEP_MS);
  }
  showStep();
}

/** Back to the run's own checkpoint: the panels read it again. */
export function ownWeights() {
  if (!state.checkpoint) return;
  clearTimeout(stepTimer);
  state.checkpoint = null;
  cursor = ownStep();
  placeSliders();
  showStep();
  changed();
}

export function setTimelineX(value) {
  logX = value === 'log';
  if (!data) return;
  drawChart();
  drawMultiples(cursor);
}

export function resizeTimeline() {
  if (chart) chart.setSize({ width: chartWidth(), height: HEIGHT });
  if (data) drawMultiples(cursor);
}

function showStep() {
  const own = !state.checkpoint;
  const o = data.own;
  const ownWords = `the run's own weights, ${o.file}${o.iter !== null ? ` (step ${fmtInt(o.iter)})` : ''}`;
  const words = !data.snapshots.length ? `step ${fmtInt(cursor)} (the curves only: no snapshots)`
    : own ? `${ownWords}: drag to a step the run kept` : `step ${fmtInt(cursor)}: a snapshot the run kept`;
  $('#step-label').textContent = words;
  $('#step-own').disabled = own;
  $('#step-own').hidden = !data.snapshots.length;
  $('#step-banner').hidden = own;
  $('#step-now').textContent = fmtInt(cursor);
  Object.assign($('#timeline-card').dataset, { step: String(cursor), checkpoint: state.checkpoint || '' });
  if (chart) chart.redraw(false, false);
  drawMultiples(cursor);
  setLine('#timeline-readout', stepInWords(recordAt(data.records, cursor)));
}

const fixed = (x, digits) => (x === null || x === undefined ? '—' : x.toFixed(digits));

/** The record at the slider's step in words: its val loss, its in-context learning score, its loss by position. */
function stepInWords(r) {
  if (!r) return '';
  const spans = r.loss_by_position.map((v) => fixed(v, 2)).join(' ');
  return `step ${fmtInt(r.iter)}: val loss ${fixed(r.val_loss, 4)} · in-context learning score ${fixed(r.icl, 4)}` +
    (spans ? ` · loss by position (${r.loss_by_position.length} spans of the context, first to last): ${spans}` : '');
}

function phaseInWords(p) {
  if (!p) return '';
  // phase_change decides whether one happened (analyze.py timeline's rule): where none did, it says why
  if (p.note) return `No phase change marked: ${p.note}.`;
  const parts = [];
  if (p.induction_iter !== null) {
    parts.push(`${headName(p.layer, p.head)}, the strongest induction head at the end, rose fastest around step ` +
      fmtInt(p.induction_iter));
  }
  if (p.icl_iter !== null) parts.push(`the in-context learning score fell fastest around step ${fmtInt(p.icl_iter)}`);
  return parts.length ? `Phase change (dashed): ${parts.join('; ')}.`
    : 'Too few records yet to tell where the phase change is.';
}

/** Where a step sits across the charts, 0 to 1: on an asinh scale (about log, and 0 at step 0) or a linear one. */
function xAt(step) {
  const all = [...data.records.map((r) => r.iter), ...data.snapshots];
  const f = logX ? Math.asinh : (v) => v;
  const lo = f(Math.min(...all));
  const hi = f(Math.max(...all));
  return hi > lo ? (f(step) - lo) / (hi - lo) : 0.5;
}

const chartWidth = () => Math.max(260, $('#timeline-curves').clientWidth || 400);

function drawChart() {
  if (chart) chart.destroy();
  chart = null;
  $('#timeline-curves').textContent = '';
  if (!data.records.length) return;
  if (typeof window.uPlot !== 'function') {
    setLine('#timeline-status', 'the chart library (static/vendor/uPlot.iife.min.js) did not load', true);
    return;
  }
  const r = data.records;
  chart = new window.uPlot(chartOptions(), [r.map((t) => t.iter), r.map((t) => t.val_loss), r.map((t) => t.icl)],
    $('#timeline-curves'));
}

function chartOptions() {
  const value = (u, v) => fixed(v, 4);
  const all = [...data.records.map((r) => r.iter), ...data.snapshots];
  return {
    width: chartWidth(),
    height: HEIGHT,
    scales: { x: { time: false, distr: logX ? 4 : 1, asinh: 1, range: () => [Math.min(...all), Math.max(...all)] },
      loss: {}, icl: {} },
    legend: { live: true },
    series: [
      { label: 'step', value: (u, v) => (v === null || v === undefined ? '—' : fmtInt(v)) },
      { label: 'val loss', scale: 'loss', stroke: '#d9730d', width: 2, spanGaps: true, value,
        points: { show: true, size: 5, fill: '#d9730d' } },
      { label: 'in-context learning score', scale: 'icl', stroke: ICL_COLOUR, width: 2, value },
    ],
    axes: [
      { label: logX ? 'step (asinh scale)' : 'step', labelSize: 18, size: 34 },
      { scale: 'loss', label: 'val loss', labelSize: 18, size: 50 },
      { scale: 'icl', label: 'ICL score', labelSize: 18, size: 54, side: 1, grid: { show: false } },
    ],
    hooks: { draw: [marks] },
  };
}

/** The phase change's steps (dashed) and the slider's step (solid) across the chart. */
function marks(u) {
  const p = data && data.phase;
  if (p) {
    mark(u, p.induction_iter, KIND_COLOURS.induction, [5, 4]);
    mark(u, p.icl_iter, ICL_COLOUR, [5, 4]);
  }
  mark(u, cursor, '#111', []);
}

function mark(u, step, colour, dash) {
  if (step === null || step === undefined) return;
  const x = u.valToPos(step, 'x', true);
  const { left, top, width, height } = u.bbox;
  if (!(x >= left - 1 && x <= left + width + 1)) return;
  const dpr = window.devicePixelRatio || 1;
  const ctx = u.ctx;
  ctx.save();
  ctx.strokeStyle = colour;
  ctx.lineWidth = 1.5 * dpr;
  ctx.setLineDash(dash.map((d) => d * dpr));
  ctx.beginPath();
  ctx.moveTo(x, top);
  ctx.lineTo(x, top + height);
  ctx.stroke();
  ctx.restore();
}
