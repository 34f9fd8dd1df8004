/* Features: the SAEs `analyze.py features` trained on the picked run, one per hook point (GET /api/runs/{name}
   lists them), and for the SAE picked: its metrics and most frequent features (GET /api/runs/{name}/sae/{hook});
   the features active at a token clicked in the written text or a read text, each with its value and its top
   contexts from the SAE's table (POST /api/token_features); one feature's row and its value at every token of a
   pasted text (POST /api/feature); and a switch on each feature, which switches.js carries in every request's
   "off" as it carries heads. Every number is the API's: the page formats them, and scales a bar or a shade to
   the largest value shown beside it. */

import { api, runUrl } from './api.js';
import { $, el, placeholder, setLine } from './dom.js';
import { lineBreaks, named, showsIds, tokenChip } from './chips.js';
import { fmtP, fmtValue, plural, quote, quoted, tokenNumber } from './format.js';
import { windowOf } from './inspector.js';
import { FEATURE_RGB, featureAlpha, shade } from './shades.js';
import { state } from './state.js';
import { answeredOff, markSwitches, offList, toggle } from './switches.js';

const NO_TOKEN = 'Click a token in the written text or in a read text to see the features active there.';
let sae = null; // GET /api/runs/{name}/sae/{hook}: the SAE picked
let token = null; // the token whose features are shown: {ids (its whole text's), index, where}
const seq = { sae: 0, token: 0, feature: 0 }; // counts requests, so that an answer overtaken is dropped

/** A new run picked: its SAEs in the picker, the first one loaded; no token or feature shown yet. */
export function buildFeatures(info) {
  state.saes = Array.isArray(info.saes) ? info.saes : [];
  sae = null;
  token = null;
  seq.token++;
  seq.feature++;
  const picker = $('#sae-hook');
  picker.textContent = '';
  for (const hook of state.saes) picker.append(new Option(hook, hook));
  $('#features-none').hidden = state.saes.length > 0;
  $('#features-body').hidden = !state.saes.length;
  for (const s of ['#sae-status', '#token-features-status', '#feature-status']) setLine(s, '');
  placeholder($('#token-features'), NO_TOKEN);
  $('#feature-row').textContent = '';
  $('#feature-output').textContent = '';
  if (state.saes.length) loadSae(state.saes[0]);
}

/** Another SAE picked: its shape, metrics and most frequent features; a token shown is asked for again. */
export async function loadSae(hook) {
  const n = ++seq.sae;
  const run = state.run;
  const box = $('#sae-metrics');
  delete box.dataset.ready;
  setLine('#sae-status', `reading the SAE at ${hook}…`);
  try {
    const data = await api('GET', runUrl(run, '/sae/' + encodeURIComponent(hook)));
    if (n !== seq.sae || run !== state.run) return;
    sae = data;
    setLine('#sae-status', '');
    renderSae(data);
  } catch (e) {
    if (n !== seq.sae) return;
    sae = null;
    box.textContent = '';
    $('#sae-frequent').textContent = '';
    setLine('#sae-status', e.message, true);
    return;
  }
  $('#feature-row').textContent = '';
  $('#feature-output').textContent = '';
  if (token) requestToken();
}

const metric = (x, digits) => (x === null || x === undefined ? '—' : x.toFixed(digits));

function renderSae(data) {
  const box = $('#sae-metrics');
  const m = data.metrics || {};
  box.textContent = `${data.d_sae} features (at most ${data.k} active at a token) reading ${data.d_in} numbers` +
    ` at ${data.hook}` +
    ` · L0 ${metric(m.l0, 2)} · explained variance ${metric(m.explained_variance, 4)}` +
    ` · CE loss recovered ${metric(m.ce_loss_recovered, 4)} · dead ${fmtP(m.dead_fraction)}`;
  box.title = 'measured on the run\'s val split when the SAE was trained';
  box.dataset.ready = '1';
  const list = $('#sae-frequent');
  list.textContent = '';
  list.append(el('span', 'legend-title', 'most frequent:'));
  for (const row of data.frequent || []) {
    const b = pickButton(row.index, `F${row.index} · ${fmtP(row.frequency)}`);
    b.title = `feature ${row.index} fires on ${fmtP(row.frequency)} of the tokens it was measured on; ` +
      'click for its row';
    list.append(b);
  }
}

function pickButton(index, text) {
  const b = el('button', 'feature-pick', text);
  b.type = 'button';
  b.dataset.index = String(index);
  b.addEventListener('click', () => pickFeature(index));
  return b;
}

/** The switch of feature i of the SAE shown: pressed while it is off (switches.js marks it). */
function offButton(index) {
  const b = el('button', 'feature-off', 'switch off');
  b.type = 'button';
  b.dataset.name = `${sae.hook} F${index}`;
  b.title = `switch feature ${index} off for this page's requests: its value times its decoder row is taken out of ` +
    `the activation at ${sae.hook}`;
  b.addEventListener('click', () => toggle(b.dataset.name));
  return b;
}

// ---------------------------------------------------------------------------------------- a token's features

/** Token index of a text (its token ids, allIds) was clicked: the features active there. */
export function featuresAt(allIds, index, where) {
  if (!state.saes.length) return;
  token = { ids: allIds, index, where };
  requestToken();
}

/** The text a shown token belongs to was replaced: the token is forgotten. */
export function forgetToken(where) {
  if (!token || token.where !== where) return;
  token = null;
  seq.token++;
  placeholder($('#token-features'), NO_TOKEN);
  setLine('#token-features-status', '');
}

async function requestToken() {
  if (!sae || !token) return;
  const n = ++seq.token;
  const box = $('#token-features');
  delete box.dataset.ready;
  const w = windowOf(token.ids, token.index);
  const body = { run: state.run, hook: sae.hook, ids: w.ids, position: w.position, off: offList() };
  setLine('#token-features-status', 'asking the model…');
  let data;
  try {
    data = await api('POST', '/api/token_features', body);
  } catch (e) {
    if (n === seq.token) setLine('#token-features-status', e.message, true);
    return;
  }
  if (n !== seq.token) return;
  setLine('#token-features-status', '');
  answeredOff(data.off);
  renderToken(data, w);
}

function renderToken(data, w) {
  const box = $('#token-features');
  box.textContent = '';
  const list = data.features || [];
  const head = el('p', 'features-head');
  head.append(el('b', null, `${tokenNumber(token.index)} of the ${token.where}, ${quoted(data.token)}`),
    `: ${plural(list.length, 'feature')} active at ${data.hook} (the SAE keeps at most ${data.k})` +
    (w.start > 0 ? `, reading a window of ${w.ids.length} tokens around it` : ''));
  box.append(head);
  const top = list.length ? list[0].value : 0;
  for (const f of list) box.append(featureLine(f, top));
  if (!list.length) box.append(el('p', 'placeholder', 'No feature is active at this token.'));
  markSwitches();
  box.dataset.ready = '1';
  box.dataset.where = token.where;
  box.dataset.index = String(token.index);
}

/** One active feature: its number (click for its row), its value with a bar against the largest, how often it
    fires, its switch, and its top contexts. */
function featureLine(f, top) {
  const line = el('div', 'feature-line');
  line.dataset.index = String(f.index);
  line.dataset.value = String(f.value);
  const track = el('span', 'track');
  const fill = el('span', 'fill');
  fill.style.width = (top > 0 ? (100 * f.value) / top : 0).toFixed(1) + '%';
  track.append(fill);
  const value = el('span', 'feature-value', fmtValue(f.value));
  value.title = f.off ? 'its value as it arrives at the hook, before it is switched off there'
    : 'its value at this token';
  line.append(pickButton(f.index, `F${f.index}`), value, track);
  if (f.row) line.append(el('span', 'feature-freq', `fires on ${fmtP(f.row.frequency)} of tokens`));
  line.append(offButton(f.index));
  if (f.row) line.append(contexts(f.row));
  return line;
}

const flat = (s) => String(s).replace(/\n/g, '↵').replace(/\t/g, '⇥');

/** A row's top contexts, each the text before, the token it fired on (marked) and after, and its value there. */
function contexts(row) {
  const box = el('div', 'contexts');
  for (const [before, tok, after, value] of row.contexts || []) {
    const c = el('span', 'context');
    const mark = el('mark', null, flat(tok).replace(/^ +$/, (s) => '␣'.repeat(s.length))); // a space, seen
    c.append(el('span', 'ctx-side', flat(before)), mark, el('span', 'ctx-side', flat(after)),
      el('span', 'context-value', fmtValue(value)));
    box.append(c);
  }
  if (!box.childElementCount) box.append(el('span', 'placeholder', 'it fired on none of the tokens its table read'));
  return box;
}

// ---------------------------------------------------------------------------------------- one feature

export function pickFeature(index) {
  $('#feature-index').value = String(index);
  requestFeature();
}

/** The feature typed or clicked: its row, and with a text, its value at each token. */
export async function requestFeature() {
  if (!sae) return setLine('#feature-status', 'no SAE is loaded', true);
  const raw = $('#feature-index').value.trim();
  if (!/^\d+$/.test(raw)) return setLine('#feature-status', 'feature: type its number (0 and up)', true);
  const n = ++seq.feature;
  const hook = sae.hook;
  const text = $('#feature-text').value;
  const out = $('#feature-output');
  delete out.dataset.ready;
  setLine('#feature-status', text ? `reading the text at ${hook}…` : '');
  let data;
  try {
    data = await api('POST', '/api/feature', { run: state.run, hook, feature: Number(raw), text, off: offList() });
  } catch (e) {
    if (n === seq.feature) setLine('#feature-status', e.message, true);
    return;
  }
  if (n !== seq.feature) return;
  setLine('#feature-status', text ? '' : 'paste a text above to see where it fires');
  answeredOff(data.off);
  renderRow(data);
  renderFires(data);
}

function renderRow(data) {
  const box = $('#feature-row');
  box.textContent = '';
  const row = data.row;
  const head = el('p', 'features-head');
  head.append(el('b', null, `F${data.feature} at ${data.hook}`));
  if (row) {
    head.append(' ', el('span', 'feature-freq', `fires on ${fmtP(row.frequency)} of tokens`),
      ` · pushes up ${row.promotes.map((t) => quote(flat(t))).join(' ')}` +
      ` · pushes down ${row.demotes.map((t) => quote(flat(t))).join(' ')}`);
  }
  head.append(' ', offButton(data.feature));
  box.append(head);
  if (row) box.append(contexts(row));
  box.dataset.index = String(data.feature);
  markSwitches();
}

function renderFires(data) {
  const out = $('#feature-output');
  out.textContent = '';
  const tokens = data.tokens || [];
  if (tokens.length) {
    const values = tokens.map((t) => t.value).filter((v) => Number.isFinite(v));
    const top = Math.max(0, ...values);
    const firing = values.filter((v) => v > 0).length;
    out.append(el('p', 'totals', `F${data.feature} fires on ${firing} of ${plural(tokens.length, 'token')}` +
      ' of this text' +
      (top > 0 ? `; its largest value here is ${fmtValue(top)} (the darkest shade)` : '')));
    const chips = el('div', 'chips');
    for (const t of tokens) {
      const c = tokenChip(t, 'chip read-chip feature-chip', showsIds(data.tokenizer_kind));
      c.dataset.value = String(t.value);
      if (t.value > 0) shade(c, FEATURE_RGB, featureAlpha(t.value / top));
      c.title = `${named(t)}: F${data.feature} ${fmtValue(t.value)}`;
      chips.append(c, ...lineBreaks(t));
    }
    out.append(chips);
  }
  out.dataset.ready = '1';
}

/** Parts went off or on: what the panel shows is asked for again with them. */
export function refreshFeatures() {
  if (token) requestToken();
  if ($('#feature-row').childElementCount) requestFeature();
}
