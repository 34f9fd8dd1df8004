/* GPT explorer: the page over gptkit/explorer/app.py's HTTP API. This module wires the page's controls to the
   panels; each panel is its own module:

     runs.js       the run list and the picked run        curves.js    its loss curves
     timeline.js   over training: the curves, the slider  multiples.js every head's scores over training
     write.js      the prompt and the streamed tokens     knobs.js     the sampling knobs
     inspector.js  the token pointed at, for the panels below the text:
       why.js        why this token                       attention.js where it looked (every head)
       headmap.js    one head's whole map                 lens.js      the logit lens
       scores.js     one head's q·k before its softmax    twoheads.js  two heads' maps side by side
     switches.js   heads, MLPs and features switched off, and each head's label
     read.js       read a text                          lab.js       the lab's runs' curves on one chart
     features.js   an SAE's features: at a clicked token, and one feature over a pasted text
   shared by them: state.js (what more than one panel reads, the weights they read among it), api.js, dom.js,
   format.js, shades.js.

   Plain ES modules, no build step, no framework. Every number shown comes from the API; the page only
   formats numbers, picks colours and bar lengths for them, adds up the attention weights a "…" box stands for,
   subtracts two runs' surprise (the Read panel's differences), counts the tokens a feature fires on and places
   steps along an axis. */

import { attentionClick, attentionHover, redrawAttention } from './attention.js';
import { resizeCurves, setXAxis } from './curves.js';
import { $ } from './dom.js';
import { featuresAt, loadSae, refreshFeatures, requestFeature } from './features.js';
import { mapHover } from './headmap.js';
import { linkSlider } from './knobs.js';
import { hoverToken, knobsChanged, leaveText, pin, requestPosition } from './inspector.js';
import { loadLab } from './lab.js';
import { readText } from './read.js';
import { loadRuns, refreshRuns } from './runs.js';
import { drawLegends } from './shades.js';
import { state } from './state.js';
import { allOn, onOffChange, refreshLabels } from './switches.js';
import { onCheckpointChange, ownWeights, resizeTimeline, setTimelineX, slideTo } from './timeline.js';
import { refreshPair } from './twoheads.js';
import { generate, stopGeneration } from './write.js';

const plainEnter = (e) => e.key === 'Enter' && !e.shiftKey && !e.isComposing && !e.ctrlKey && !e.metaKey && !e.altKey;

function wireWriting() {
  $('#generate').addEventListener('click', () => generate());
  $('#stop').addEventListener('click', () => stopGeneration('user'));
  $('#prompt').addEventListener('keydown', (e) => {
    if (!plainEnter(e)) return;
    e.preventDefault();
    generate();
  });
  linkSlider('#temperature-range', '#temperature', knobsChanged);
  linkSlider('#top-p-range', '#top-p', knobsChanged);
  $('#top-k').addEventListener('input', knobsChanged);
}

/** Pin token i of the written text: the panels below show it, and the Features panel its features. */
function pinWritten(i) {
  pin(i);
  featuresAt(state.chips.map((c) => c.id), i, 'written text');
}

/** Hover a token to show it in the panels below, click to pin it, arrow keys to move the pin. */
function wirePointing() {
  const out = $('#output');
  const chipAt = (e) => {
    const c = e.target.closest('.chip');
    return c && out.contains(c) ? Number(c.dataset.index) : null;
  };
  out.addEventListener('mouseover', (e) => {
    const i = chipAt(e);
    if (i !== null) hoverToken(i);
  });
  out.addEventListener('mouseleave', leaveText);
  out.addEventListener('click', (e) => {
    const i = chipAt(e);
    if (i !== null) pinWritten(i);
  });
  document.addEventListener('keydown', (e) => {
    if (state.pinned === null || e.ctrlKey || e.metaKey || e.altKey) return;
    if (['INPUT', 'TEXTAREA', 'SELECT'].includes((e.target && e.target.tagName) || '')) return;
    const step = { ArrowLeft: -1, ArrowRight: 1 }[e.key];
    const to = state.pinned + (step || 0);
    if (!step || to < 0 || to >= state.chips.length) return;
    e.preventDefault();
    pinWritten(to);
  });
  const grid = $('#attention');
  grid.addEventListener('click', attentionClick);
  grid.addEventListener('mousemove', attentionHover);
  $('#attention-map').addEventListener('mousemove', mapHover);
}

function wireRest() {
  for (const r of document.querySelectorAll('input[name="xaxis"]')) {
    r.addEventListener('change', () => {
      if (r.checked) setXAxis(r.value);
    });
  }
  $('#read-go').addEventListener('click', () => readText());
  $('#read-text').addEventListener('keydown', (e) => {
    if (e.key !== 'Enter' || !(e.ctrlKey || e.metaKey)) return;
    e.preventDefault();
    readText();
  });
  // back in view (another tab, a terminal where a run trains): the list as the folder is now
  window.addEventListener('focus', () => {
    refreshRuns();
    loadLab();
  });
  document.addEventListener('visibilitychange', () => {
    if (document.visibilityState === 'visible') {
      refreshRuns();
      loadLab();
    }
  });
  let resizeTimer = 0;
  window.addEventListener('resize', () => {
    clearTimeout(resizeTimer);
    resizeTimer = setTimeout(() => {
      resizeCurves();
      resizeTimeline();
      redrawAttention();
    }, 200); // once the window stops changing size
  });
}

function wireFeatures() {
  $('#sae-hook').addEventListener('change', () => loadSae($('#sae-hook').value));
  $('#feature-go').addEventListener('click', () => requestFeature());
  for (const id of ['#feature-index', '#feature-text']) {
    $(id).addEventListener('keydown', (e) => {
      if (e.key !== 'Enter' || (id === '#feature-text' && !(e.ctrlKey || e.metaKey))) return;
      e.preventDefault();
      requestFeature();
    });
  }
}

/** A part switched off or on: the panels showing a token, and a text read, are asked for again with it. */
function wireSwitches() {
  onOffChange((labelsOnly) => {
    redrawAttention(); // the cells' labels and which are off
    if (labelsOnly) return;
    const i = state.pinned !== null ? state.pinned : state.shown ? state.shown.index : null;
    if (i !== null) requestPosition(i);
    if ($('#read-output').childElementCount) readText();
    refreshFeatures();
  });
  $('#all-on').addEventListener('click', allOn);
  for (const side of ['a', 'b']) $(`#pair-${side}`).addEventListener('change', refreshPair);
}

/** The Over training slider (and its copy in the banner) moved to a snapshot, or back to the run's own weights: the
    heads' labels, the panels showing a token and a text read are asked for again at those weights; writing uses
    them from the next Generate. The Features panel stays on the run's own weights, which its SAEs read. */
function wireSteps() {
  for (const id of ['#step-range', '#step-range-mini']) {
    $(id).addEventListener('input', (e) => slideTo(Number(e.target.value)));
  }
  for (const id of ['#step-own', '#step-own-mini']) $(id).addEventListener('click', ownWeights);
  for (const r of document.querySelectorAll('input[name="timeline-x"]')) {
    r.addEventListener('change', () => {
      if (r.checked) setTimelineX(r.value);
    });
  }
  onCheckpointChange(() => {
    refreshLabels();
    const i = state.pinned !== null ? state.pinned : state.shown ? state.shown.index : null;
    if (i !== null) requestPosition(i);
    if ($('#read-output').childElementCount) readText();
  });
}

// a module runs after the document is parsed, so the page's elements are all there
drawLegends();
wireWriting();
wirePointing();
wireRest();
wireSwitches();
wireFeatures();
wireSteps();
loadRuns();
loadLab();
