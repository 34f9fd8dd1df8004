/* The logit lens: what the residual stream at the pointed token would predict next after the embeddings
   and after each layer. */

import { $, el, probabilityTrack } from './dom.js';
import { fmtP, quoted, tokenNumber } from './format.js';
import { state } from './state.js';

/** A lens row's name, counted from layer 0 as everywhere on the page: the rows are the embeddings, then the
    output of each layer in turn; the last is the model's own prediction (a bigram model's only row). */
function rowName(r, rows) {
  const name = r === 0 ? 'embeddings' : `after layer ${r - 1}`;
  return r === rows - 1 ? `${name} (the model's prediction)` : name;
}

export function renderLens(i, data) {
  const box = $('#lens');
  box.textContent = '';
  const lens = Array.isArray(data.lens) ? data.lens : [];
  const next = state.chips[i + 1];
  const cap = el('p', 'hint');
  cap.append(`After ${quoted(state.chips[i])} (${tokenNumber(i)}), `);
  cap.append(next ? `the token that came next was ${quoted(next)} (marked).` : 'nothing has come next yet.');
  box.append(cap);
  lens.forEach((row, r) => {
    const name = rowName(r, lens.length);
    const div = el('div', 'lens-row');
    if (r === lens.length - 1) div.classList.add('final');
    div.append(el('span', 'lens-name', name));
    const tops = el('div', 'lens-top');
    for (const t of (row.top || []).slice(0, 5)) {
      const item = el('div', 'lens-item');
      if (next && t.id === next.id) item.classList.add('next');
      item.append(el('span', 'lab', t.label));
      item.append(el('span', 'val', fmtP(t.p)));
      item.append(probabilityTrack(t.p));
      item.title = `${name}: ${quoted(t)} ${fmtP(t.p)}`;
      tops.append(item);
    }
    div.append(tops);
    box.append(div);
  });
  if (!lens.length) box.append(el('p', 'placeholder', 'The server sent no layers for the lens.'));
  box.dataset.ready = '1';
  box.dataset.index = String(i);
}
