/* Read a text: every token of a pasted text shaded by the model's surprise at it (POST /api/read), and with
   a second run, the difference token by token. The page's only arithmetic is that difference of two API
   numbers. The picked run reads at the weights the Over training slider picked; a second run at its own. A token
   of the picked run's reading is clicked for its features (features.js). */

import { api } from './api.js';
import { $, el, setLine } from './dom.js';
import { lineBreaks, named, showsIds, tokenChip } from './chips.js';
import { featuresAt } from './features.js';
import { fmtBits, fmtInt, fmtSigned } from './format.js';
import { BETTER_RGB, SURPRISE_RGB, WORSE_RGB, diffAlpha, shade, surpriseAlpha, swatch } from './shades.js';
import { atStep, state, stepWords } from './state.js';
import { offList } from './switches.js';

let readSeq = 0; // counts reads, so that an answer for an earlier text or run is dropped

export function clearReadOutput() {
  readSeq++;
  $('#read-output').textContent = '';
  setLine('#read-status', '');
  $('#read-go').disabled = false;
}

export function fillSecondRunPicker() {
  const sel = $('#read-run2');
  const keep = sel.value;
  sel.textContent = '';
  sel.append(new Option('(no second run)', ''));
  for (const r of state.runs) if (!r.error) sel.append(new Option(r.name, r.name));
  if ([...sel.options].some((o) => o.value === keep)) sel.value = keep;
}

export async function readText() {
  if (!state.run) return setLine('#read-status', 'pick a run first', true);
  const text = $('#read-text').value;
  if (!text) return setLine('#read-status', 'type or paste a text first', true);
  const runA = state.run;
  const runB = $('#read-run2').value || null;
  const seq = ++readSeq;
  setLine('#read-status', runB ? `reading with ${runA} and ${runB}…` : `reading with ${runA}…`);
  $('#read-go').disabled = true;
  const off = offList(); // the picked run's parts: a second run of another shape has other heads
  const nameA = `${runA}${stepWords()}${off.length ? ` with ${off.join(', ')} off` : ''}`;
  const asks = [api('POST', '/api/read', atStep({ run: runA, text, off }))];
  if (runB) asks.push(api('POST', '/api/read', { run: runB, text }));
  const results = await Promise.allSettled(asks);
  if (seq !== readSeq) return;
  $('#read-go').disabled = false;
  setLine('#read-status', '');
  const out = $('#read-output');
  out.textContent = '';
  const pair = el('div', 'read-pair' + (runB ? '' : ' single'));
  pair.append(readRow(nameA, results[0], true));
  if (runB) pair.append(readRow(runB, results[1]));
  out.append(pair);
  const intact = results[0].status === 'fulfilled' && results[0].value.intact;
  if (intact) out.append(diffRow(`${runA}${stepWords()} intact`, intact, nameA, results[0].value));
  if (runB && results.every((r) => r.status === 'fulfilled')) out.append(diffRow(nameA, results[0].value, runB, results[1].value));
  const failed = results.filter((r) => r.status === 'rejected').length;
  if (failed) setLine('#read-status', failed === results.length ? 'the text could not be read' : 'one run could not read the text', true);
}

/** A chip per token (with its id under it for a BPE run), and a line break after each newline so that the text
    keeps its lines. */
function tokenChips(tokens, kind, paint) {
  const chips = el('div', 'chips');
  tokens.forEach((t, j) => {
    const c = tokenChip(t, 'chip read-chip', showsIds(kind));
    c.dataset.index = String(j);
    paint(c, t, j);
    chips.append(c, ...lineBreaks(t));
  });
  return chips;
}

/** The picked run's row (pickable): a click on a token shows its features, where the run has an SAE. */
function readRow(name, result, pickable = false) {
  const row = el('div', 'read-row');
  row.dataset.run = name;
  row.append(el('h3', null, name));
  if (result.status === 'rejected') {
    const e = result.reason;
    row.append(el('p', 'line-status error', e && e.message ? e.message : String(e)));
    return row;
  }
  const r = result.value;
  row.append(readTotals(r));
  const chips = tokenChips(r.tokens || [], r.tokenizer_kind, (c, t) => {
    const b = t.surprise_bits;
    if (b === null || b === undefined) {
      c.classList.add('none');
      c.title = `${named(t)}: the first token, nothing before it to predict it from`;
      return;
    }
    shade(c, SURPRISE_RGB, surpriseAlpha(b));
    c.title = `${named(t)}: ${fmtBits(b)} bits of surprise`;
    c.dataset.bits = String(b);
  });
  if (pickable && state.saes.length) pickTokens(chips, r.tokens);
  row.append(chips);
  return row;
}

function pickTokens(chips, tokens) {
  chips.classList.add('pickable');
  chips.addEventListener('click', (e) => {
    const c = e.target.closest('.read-chip');
    if (!c) return;
    for (const p of chips.querySelectorAll('.read-chip.pinned')) p.classList.remove('pinned');
    c.classList.add('pinned');
    featuresAt(tokens.map((t) => t.id), Number(c.dataset.index), 'read text');
  });
}

const fixed = (x, digits) => (x === null || x === undefined || !Number.isFinite(x) ? '—' : x.toFixed(digits));

/** The text's score two ways: bits per character, which compares runs whatever their tokens, and nats per token,
    the loss train.py reports; then where they come from. */
function readTotals(r) {
  const totals = el('p', 'totals');
  const bpc = el('b', 'bits-per-char', `${fixed(r.bits_per_char, 3)} bits per character`);
  bpc.title = 'the bits of every predicted token, summed, over the characters they spell: runs cut into other tokens compare on it';
  const npt = el('b', 'nats-per-token', `${fixed(r.loss, 3)} nats per token`);
  npt.title = 'the mean over the predicted tokens of −ln p, the loss train.py reports';
  const tokens = (r.tokens || []).length;
  const counted = (n, word) => `${fmtInt(n)} ${word}${n === 1 ? '' : 's'}`;
  const predicted = counted(r.predicted_chars, 'character');
  const bits = fmtBits(r.total_bits);
  totals.append(bpc, ' · ', npt, ` · ${bits} bits in all, over the ${predicted} after the first token`);
  totals.append(` (the text: ${counted(r.chars, 'character')}, ${counted(tokens, 'token')})`);
  return totals;
}

function diffLegend(nameB) {
  const legend = el('div', 'diff-legend');
  for (const [d, words] of [[-4, `${nameB} better (fewer bits)`], [-1, ''], [1, ''], [4, `${nameB} worse (more bits)`]]) {
    legend.append(swatch(fmtSigned(d, 0), d < 0 ? BETTER_RGB : WORSE_RGB, diffAlpha(d)));
    if (words) legend.append(el('span', null, words));
  }
  return legend;
}

function diffRow(nameA, a, nameB, b) {
  const row = el('div', 'read-row diff');
  row.append(el('h3', null, `${nameB} minus ${nameA}, token by token`));
  const ta = a.tokens || [];
  const tb = b.tokens || [];
  if (ta.length !== tb.length || !ta.every((t, j) => t.id === tb[j].id)) {
    row.append(el('p', 'totals', 'The two runs cut this text into different tokens, so there is no token-by-token difference: compare their bits per character above.'));
    return row;
  }
  const total = b.total_bits - a.total_bits;
  const totals = el('p', 'totals');
  totals.append(el('b', null, `${fmtSigned(total)} bits in all`));
  totals.append(total < 0 ? `: ${nameB} needs fewer bits (it predicts this text better)` : total > 0 ? `: ${nameB} needs more bits (it predicts this text worse)` : ': the same');
  row.append(totals, diffLegend(nameB));
  row.append(tokenChips(ta, a.tokenizer_kind, (c, t, j) => {
    const ba = t.surprise_bits;
    const bb = tb[j].surprise_bits;
    if (ba === null || ba === undefined || bb === null || bb === undefined) {
      c.classList.add('none');
      c.title = `${named(t)}: no prediction for the first token`;
      return;
    }
    const d = bb - ba;
    shade(c, d < 0 ? BETTER_RGB : WORSE_RGB, diffAlpha(d));
    c.title = `${named(t)}: ${nameA} ${fmtBits(ba)} bits, ${nameB} ${fmtBits(bb)} bits, difference ${fmtSigned(d)}`;
    c.dataset.diff = String(d);
  }));
  return row;
}
