/* Switching parts of the model off: a switch for every head (a row per layer, as the attention grid) and for
   every layer's MLP, and features (their switches are in the Features panel, features.js). What is off travels
   with each request ("off": ["L0H3", "MLP1", "blocks.1.hook_resid_post F12"]), never as state on the server, so
   another tab's experiment never changes this one's numbers; the banner names it. Each head's switch wears the
   label of what that head does most (GET /api/runs/{name}/heads), as its cell in the grid does: at the weights
   the Over training slider picked (?checkpoint=iter:N), if it picked a snapshot. */

import { api, runUrl } from './api.js';
import { $, el, setLine } from './dom.js';
import { headName } from './format.js';
import { state, stepWords } from './state.js';

export const KIND_WORDS = { previous_token: 'previous-token', first_token: 'first-token', duplicate_token: 'duplicate',
  induction: 'induction', local: 'local' };
let changed = () => {}; // what the panels do when a part goes off or on again (explorer.js wires it)
let labelSeq = 0; // counts label requests, so that the labels of weights no longer picked are dropped

export function onOffChange(fn) {
  changed = fn;
}

/** The names the requests carry in "off", in the server's order: heads and MLPs, then features. */
export const offList = () => state.off.slice();

export const isOff = (name) => state.off.includes(name);

const FEATURE = /^(\S+) F(\d+)$/; // 'blocks.1.hook_resid_post F12': feature 12 of the SAE at that hook point

/** Names in the order the server answers them with: heads and MLPs as their switches stand, then features by
    their hook's place in the model (the picked run's SAEs come in that order) and their number. */
function ordered(names) {
  const parts = [...document.querySelectorAll('#switches .switch')].map((b) => b.dataset.name)
    .filter((n) => names.includes(n));
  const key = (n) => {
    const m = FEATURE.exec(n);
    return [state.saes.indexOf(m[1]), Number(m[2])];
  };
  const features = names.filter((n) => FEATURE.test(n)).sort((a, b) => {
    const [ha, ia] = key(a);
    const [hb, ib] = key(b);
    return ha - hb || ia - ib;
  });
  return [...parts, ...features];
}

/** The label of head (l, h) in words ('' while unknown, or for a head no detector calls). */
export function headKind(l, h) {
  const labels = state.labels && state.labels.labels;
  const kind = labels && labels[l] ? labels[l][h] : '';
  return KIND_WORDS[kind] || '';
}

/** A new run picked: every part on, a switch for each of its heads and MLPs, and its heads' labels asked for. */
export function buildSwitches(info, seq) {
  state.off = [];
  state.labels = null;
  const box = $('#switches');
  box.textContent = '';
  renderBanner();
  setLine('#switches-status', '');
  if (!info.n_layer) {
    box.style.gridTemplateColumns = '';
    box.append(el('p', 'placeholder', 'This model has no heads or MLPs to switch off (a bigram model).'));
    return;
  }
  box.style.gridTemplateColumns = `max-content repeat(${info.n_head + (info.mlp ? 1 : 0)}, minmax(70px, 1fr))`;
  for (let l = 0; l < info.n_layer; l++) {
    box.append(el('span', 'att-layer-label', `L${l}`));
    for (let h = 0; h < info.n_head; h++) box.append(switchButton(headName(l, h), `head ${h} of layer ${l}`));
    if (info.mlp) box.append(switchButton(`MLP${l}`, `layer ${l}'s MLP`));
  }
  loadLabels(info.name, seq);
}

function switchButton(name, words) {
  const b = el('button', 'switch');
  b.type = 'button';
  b.dataset.name = name;
  b.setAttribute('aria-pressed', 'false');
  b.title = `switch ${words} off (zero ablation) for this page's requests`;
  b.append(el('b', 'switch-name', name), el('span', 'switch-kind'));
  b.addEventListener('click', () => toggle(name));
  return b;
}

/** Switch a part (a head, an MLP or a feature, by name) off, or back on when it is off. */
export function toggle(name) {
  state.off = ordered(isOff(name) ? state.off.filter((n) => n !== name) : [...state.off, name]);
  markSwitches();
  renderBanner();
  changed();
}

/** Every switch on the page, the heads' and MLPs' and the features', pressed where its part is off. */
export function markSwitches() {
  for (const b of document.querySelectorAll('#switches .switch, .feature-off')) {
    b.classList.toggle('off', isOff(b.dataset.name));
    b.setAttribute('aria-pressed', String(isOff(b.dataset.name)));
  }
}

export function allOn() {
  if (!state.off.length) return;
  state.off = [];
  markSwitches();
  renderBanner();
  changed();
}

async function loadLabels(name, seq) {
  const mine = ++labelSeq;
  const at = state.checkpoint ? '?checkpoint=' + encodeURIComponent(state.checkpoint) : '';
  try {
    const labels = await api('GET', runUrl(name, '/heads') + at);
    if (seq !== state.pickSeq || mine !== labelSeq) return;
    state.labels = labels;
  } catch (e) {
    if (seq === state.pickSeq && mine === labelSeq) setLine('#switches-status', 'no labels: ' + e.message, true);
    return;
  }
  for (const b of document.querySelectorAll('#switches .switch')) {
    const m = /^L(\d+)H(\d+)$/.exec(b.dataset.name);
    if (m) b.querySelector('.switch-kind').textContent = headKind(Number(m[1]), Number(m[2]));
  }
  setLine('#switches-status', `labels from what each head does${stepWords()} on ${state.labels.text}`);
  changed(true);
}

/** The weights the panels read changed (the Over training slider): the heads' labels at those. */
export function refreshLabels() {
  if (state.run && state.info && state.info.n_layer) loadLabels(state.run, state.pickSeq);
}

/** The banner naming what is off; the server's note (every head off) when an answer brought one. */
export function renderBanner(note) {
  const banner = $('#off-banner');
  banner.hidden = !state.off.length;
  if (!state.off.length) return;
  $('#off-names').textContent = state.off.join(', ');
  const n = $('#off-note');
  if (note !== undefined) {
    n.hidden = !note;
    n.textContent = note || '';
  }
}

/** An answer's "off" ({names, label, note}): its note shown while those are still the parts off. */
export function answeredOff(off) {
  if (off && Array.isArray(off.names) && off.names.join() === state.off.join()) renderBanner(off.note);
}
