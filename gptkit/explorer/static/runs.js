/* The runs on the left: the list (GET /api/runs), picking one (GET /api/runs/{name}) and its card. Picking
   a run empties the panels that showed the last one. The list is asked for again whenever the page comes back
   into view, so that a run trained meanwhile appears and a checkpoint replaced shows its new model. */

import { api, runUrl } from './api.js';
import { loadMetrics } from './curves.js';
import { $, el, oneLine, setLine } from './dom.js';
import { buildFeatures } from './features.js';
import { fmtInt, headName, plural } from './format.js';
import { clearReadOutput, fillSecondRunPicker } from './read.js';
import { state } from './state.js';
import { buildSwitches } from './switches.js';
import { clearTimeline, loadTimeline } from './timeline.js';
import { fillPairPickers } from './twoheads.js';
import { clearOutput, setChat, stopGeneration } from './write.js';

const listed = (data) => (data && Array.isArray(data.runs) ? data.runs.filter((r) => r && typeof r.name === 'string') : []);

export async function loadRuns() {
  let data;
  try {
    data = await api('GET', '/api/runs');
  } catch (e) {
    $('#runs').textContent = '';
    setLine('#runs-status', e.message, true);
    return;
  }
  state.runs = listed(data);
  $('#root').textContent = (data && data.root) || '?';
  renderRuns();
  fillSecondRunPicker();
  const first = state.runs.find((r) => !r.error);
  if (!state.runs.length) setLine('#runs-status', 'no runs in this folder (a run folder holds best.pt or latest.pt)', true);
  else if (!first) setLine('#runs-status', 'none of these runs can be opened', true);
  else pickRun(first.name);
}

let refreshing = false;
let askedAgain = false;

/** The list as the folder is now; the picked run is loaded again when its checkpoint now holds another model.
    Asked for while a list is on its way, it is asked once more when that one is in: the folder may have changed
    after the server read it (a run trained meanwhile), and two at once could land out of order. */
export async function refreshRuns() {
  if (refreshing) {
    askedAgain = true;
    return;
  }
  refreshing = true;
  try {
    let said = false;
    do {
      askedAgain = false;
      said = await refreshOnce(said);
    } while (askedAgain);
  } finally {
    refreshing = false;
  }
}

/** One list, and what it changes; true when it came. kept: a list before it in this refresh came, and the line
    it wrote under the runs ('... loaded again') stays. */
async function refreshOnce(kept) {
  try {
    const before = state.runs.find((r) => r.name === state.run);
    const data = await api('GET', '/api/runs');
    state.runs = listed(data);
    renderRuns();
    fillSecondRunPicker();
    if (!kept) setLine('#runs-status', '');
    const now = state.runs.find((r) => r.name === state.run);
    // the step too: a resume's new best.pt is a model of the same shape, and the curves and timeline go on; and
    // which write of the file it is: a run trained again to the same step is another model of the same step
    const model = (r) => JSON.stringify([r.settings, r.params, r.tokenizer, r.checkpoint, r.error, r.chat, r.step,
      r.written]);
    if (before && !now) {
      const root = (data && data.root) || 'the folder';
      const gone = `run ${before.name} is no longer in ${root} (its folder was removed or renamed)`;
      setLine('#run-status', gone + ': pick another run', true);
    } else if (!before && now) {
      pickRun(now.name, true); // back again (renamed back, trained again): as it is now
    } else if (before && now && model(before) !== model(now)) {
      pickRun(now.name, true);
      setLine('#runs-status', loadedAgain(before, now));
    } else if (before && now && JSON.stringify([now.iterations, now.final_val_loss])
      !== JSON.stringify([before.iterations, before.final_val_loss])) {
      // the same model, trained on: its curves and timeline as far as the list says
      loadMetrics(now.name, state.pickSeq);
      loadTimeline(now.name, state.pickSeq);
    }
    const first = state.runs.find((r) => !r.error);
    if (!state.run && first) pickRun(first.name);
    return true;
  } catch (e) {
    setLine('#runs-status', e.message, true);
    return false;
  }
}

/** Why the picked run was loaded again, where its card does not show it: its checkpoint holds another step, or
    the same step written again (the run trained again into its folder); else ''. */
function loadedAgain(before, now) {
  const file = `${now.name}'s ${now.checkpoint}`;
  if (now.step !== before.step && Number.isFinite(now.step) && Number.isFinite(before.step)) {
    return `${file} now holds step ${fmtInt(now.step)} (it held ${fmtInt(before.step)}): loaded again`;
  }
  if (now.checkpoint === before.checkpoint && now.written !== before.written) {
    const held = Number.isFinite(now.step) ? ` (it still holds step ${fmtInt(now.step)})` : '';
    return `${file} was written again since it was loaded${held}: loaded again`;
  }
  return '';
}

function renderRuns() {
  const box = $('#runs');
  box.textContent = '';
  for (const r of state.runs) {
    let b;
    try {
      b = runButton(r);
    } catch (e) {
      // one run's record the page cannot show never keeps the runs after it off the list
      b = runButton({ name: r.name, error: 'this run\'s details cannot be shown (' + oneLine(e.message) + ')' });
    }
    if (r.name === state.run) {
      b.classList.add('selected');
      b.setAttribute('aria-current', 'true');
    }
    box.append(b);
  }
}

function runButton(r) {
  const b = el('button', 'run');
  b.type = 'button';
  b.dataset.name = r.name;
  b.setAttribute('role', 'listitem');
  b.append(el('span', 'run-name', r.rung && r.rung.cheats ? r.name + ' (cheats)' : r.name));
  // a rung of the attention lab: what it adds to the path, as the lab's table says
  if (r.rung) b.append(el('span', 'run-rung', `${r.rung.step}. ${r.rung.adds}`));
  if (r.error) {
    b.classList.add('broken');
    b.disabled = true;
    b.setAttribute('aria-disabled', 'true');
    b.append(el('span', 'run-error', r.error));
    b.title = 'this run cannot be opened: ' + oneLine(r.error);
  } else {
    appendRunStats(b, r);
    b.addEventListener('click', () => pickRun(r.name));
  }
  return b;
}

function appendRunStats(b, r) {
  if (r.settings) b.append(el('span', 'run-settings', r.settings));
  const part = (before, bold, after) => {
    const s = el('span', 'nw');
    s.append(before, el('b', null, bold), after);
    return s;
  };
  const iters = Number.isFinite(r.iterations) ? fmtInt(r.iterations) : '—';
  const loss = Number.isFinite(r.final_val_loss) ? r.final_val_loss.toFixed(4) : '—';
  const stats = el('span', 'run-stats');
  stats.append(part('', fmtInt(r.params), ' parameters'), ' · ', part('', iters, ' iterations'), ' · ', part('val loss ', loss, ''));
  // cut into other tokens than characters, a loss per token compares with no other tokenizer's: per character does
  if (r.tokenizer_kind && r.tokenizer_kind !== 'char' && Number.isFinite(r.bits_per_char)) {
    stats.append(' · ', part('', r.bits_per_char.toFixed(3), ' bits per character'));
  }
  b.append(stats);
  if (r.tokenizer) b.append(el('span', 'run-stats', 'tokens: ' + r.tokenizer));
  if (r.chat) b.append(el('span', 'run-stats', 'a chat run: Write asks it questions'));
  // train.py's line on what the adapters trained; the count above is of the model the explorer runs, merged
  if (r.lora) {
    b.append(el('span', 'run-stats', `${r.lora}. The explorer runs the adapters merged into their matrices: ` +
      `${fmtInt(r.params)} parameters`));
  }
  if (r.checkpoint === 'latest.pt') b.append(el('span', 'run-health', 'shows latest.pt, its latest state: the run has no best.pt'));
  if (r.health) b.append(el('span', 'run-health', r.health));
  if (r.metrics_error) b.append(el('span', 'run-error', 'no curves: ' + r.metrics_error));
}

export function pickRun(name, again = false) {
  if (!again && state.run === name && (state.info || state.infoPromise)) return state.infoPromise;
  const seq = ++state.pickSeq;
  stopGeneration('run');
  clearTimeline(); // the run's own weights, until its timeline's slider picks a snapshot
  state.run = name;
  state.info = null;
  for (const b of document.querySelectorAll('#runs .run')) {
    const on = b.dataset.name === name;
    b.classList.toggle('selected', on);
    if (on) b.setAttribute('aria-current', 'true');
    else b.removeAttribute('aria-current');
  }
  const cur = $('#current-run');
  cur.textContent = 'picked: ';
  cur.append(el('b', null, name));
  $('#read-run1').textContent = name;
  $('#run-title').textContent = 'Picked run: ' + name;
  $('#run-note').hidden = true;
  $('#run-code-note').hidden = true;
  for (const n of document.querySelectorAll('.watch-note')) n.hidden = true;
  renderFacts([['loading', 'the model…']]);
  setLine('#run-status', '');
  const entry = state.runs.find((r) => r.name === name);
  setChat(entry && entry.chat);
  clearOutput('Picked ' + name + (state.chat ? ', a chat run. Type a question and press Ask.' : '. Type a prompt and press Generate.'));
  clearReadOutput();
  loadMetrics(name, seq);
  loadTimeline(name, seq);
  state.infoPromise = loadInfo(name, seq);
  return state.infoPromise;
}

async function loadInfo(name, seq) {
  try {
    const info = await api('GET', runUrl(name));
    if (seq !== state.pickSeq) return null;
    state.info = info;
    setChat(info.chat);
    renderInfo(info);
    buildSwitches(info, seq);
    buildFeatures(info);
    fillPairPickers(info);
    return info;
  } catch (e) {
    if (seq !== state.pickSeq) return null;
    renderFacts([]);
    setLine('#run-status', e.message, true);
    setLine('#status', 'this run could not be loaded: ' + e.message, true);
    return null;
  }
}

function renderFacts(rows) {
  const dl = $('#run-info');
  dl.textContent = '';
  for (const [k, v] of rows) dl.append(el('dt', null, k), el('dd', null, v));
}

/** The model's shape in words, and the names its heads go by on this page (counted from 0). */
function shapeInWords(info) {
  const shape = `${plural(info.n_layer, 'layer')} × ${plural(info.n_head, 'head')}`;
  if (!info.n_layer || !info.n_head) return shape;
  return `${shape}: ${headName(0, 0)} … ${headName(info.n_layer - 1, info.n_head - 1)}`;
}

function renderInfo(info) {
  renderFacts([
    ['settings', info.settings || '—'],
    ['shape', shapeInWords(info)],
    ['context', `${fmtInt(info.block_size)} tokens`],
    ['attention', `${info.attention}${info.causal ? ', causal (sees only the past)' : ', not causal (sees the future too)'}`],
    ['vocabulary', `${fmtInt(info.vocab_size)} tokens (${info.tokenizer})`],
    ['decoding', info.decode || '—'],
  ]);
  const note = $('#run-note');
  note.hidden = !info.note;
  note.textContent = info.note || '';
  note.classList.toggle('cheat', info.causal === false);
  // model.py edited since the run trained: the console's note, where a learner looks
  const code = $('#run-code-note');
  code.hidden = !info.code_note;
  code.textContent = info.code_note || '';
  // an edit the passes that watch hooks write out in their own code: the console's note, in each panel read so
  for (const n of document.querySelectorAll('.watch-note')) {
    n.hidden = !info.watch_note;
    n.textContent = info.watch_note || '';
  }
  setLine('#run-status', '');
  setLine('#status', info.chat ? `Loaded ${info.name}, a chat run. Type a question and press Ask (or Enter).`
    : `Loaded ${info.name}. Type a prompt and press Generate (or Enter).`);
}
