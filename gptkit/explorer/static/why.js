/* Why this token: the candidates the model weighed for the pointed token, as the model scores them and as
   the sampling knobs reshape them. */

import { $, el, probabilityTrack } from './dom.js';
import { fmtBits, fmtP, quoted, tokenNumber } from './format.js';
import { knobsInWords } from './knobs.js';
import { state } from './state.js';

export function renderWhy(i, w, data, knobs) {
  const why = data.why || {};
  const token = data.token || state.chips[i];
  renderHead(i, w, why, token);
  const note = $('#why-note');
  note.hidden = !why.note;
  note.textContent = why.note || '';

  const box = $('#why');
  box.textContent = '';
  const raw = Array.isArray(why.raw) ? why.raw : [];
  const shaped = Array.isArray(why.shaped) ? why.shaped : [];
  if (!raw.length && !shaped.length) {
    box.append(el('p', 'placeholder', why.note ? 'No candidates to show for this token.' : 'The server sent no candidates.'));
  } else {
    box.append(barGroup('temperature 1 (the model)', `the ${raw.length} likeliest next tokens, as the model scores them`, raw, token, 'raw'));
    box.append(barGroup('after temperature/top-k/top-p', `what sampling draws from now: ${knobsInWords(knobs)}`, shaped, token, 'shaped'));
  }
  box.dataset.ready = '1';
  box.dataset.index = String(i);
}

/** The line above the bars: the token, where it is in the text, and how surprised the model was. */
function renderHead(i, w, why, token) {
  const chip = state.chips[i];
  const head = $('#why-head');
  head.textContent = '';
  head.append(el('span', 'tok', token.label));
  head.append(el('span', 'sub', `${tokenNumber(i)} of ${state.chips.length}${chip.gen ? ', written by the model' : ', from your prompt'}` +
    (w.start > 0 ? ` · the model reads a window of ${w.ids.length} tokens around it (its context)` : '')));
  if (why.surprise_bits !== null && why.surprise_bits !== undefined) {
    const s = el('span', 'big', `surprise: ${fmtBits(why.surprise_bits)} bits`);
    s.title = 'how surprised the model was to see this token, −log₂ of its probability: 1 bit = a coin flip, 0 = certain';
    head.append(s);
  }
  if (chip.gen) head.append(el('span', 'sub', `when written: the model gave it ${fmtP(chip.p)}, sampling ${fmtP(chip.p_shaped)} (with the knobs used then)`));
}

function barGroup(title, sub, list, token, cls) {
  const g = el('div', 'bar-group ' + cls);
  g.append(el('h3', null, title));
  g.append(el('p', 'sub', sub));
  for (const c of list) {
    const row = el('div', 'bar ' + cls);
    row.dataset.id = String(c.id);
    if (c.id === token.id) row.classList.add('actual');
    row.append(el('span', 'lab', c.label));
    row.append(probabilityTrack(c.p));
    row.append(el('span', 'val', fmtP(c.p)));
    row.title = `${quoted(c)}: ${fmtP(c.p)}${c.id === token.id ? ' (the token that was actually there)' : ''}`;
    g.append(row);
  }
  if (!list.some((c) => c.id === token.id)) {
    g.append(el('p', 'missing', `${quoted(token)}, the token actually there, is not among these ${list.length}.`));
  }
  return g;
}
