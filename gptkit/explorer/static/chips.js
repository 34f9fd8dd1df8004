/* A token's chip, as the write and read panels show a text's tokens. Char-level, a chip is a character in the
   flow of the text. Cut by a BPE, each chip is a box with the token's id under it, so that a learner sees where
   a word was cut and which token each piece is; a token that holds part of a character's UTF-8 bytes shows
   them as ⟨e4⟩ (its label), since its text alone is no character. */

import { el } from './dom.js';
import { isBlank, partial, quoted, shownText } from './format.js';

/** Whether the tokens of a run with this tokenizer ('char', 'bpe', 'tiktoken') get their ids drawn. */
export const showsIds = (kind) => Boolean(kind) && kind !== 'char';

/** The token as a hover title names it: its label and its id. */
export const named = (t) => `${quoted(t)} (token id ${t.id})`;

export function tokenChip(t, cls, withId) {
  const c = el('span', cls);
  c.dataset.id = String(t.id);
  if (isBlank(t.text)) c.classList.add('ws');
  if (partial(t.text)) c.classList.add('bytes');
  if (!withId) {
    c.textContent = shownText(t);
    return c;
  }
  c.classList.add('with-id');
  c.append(el('span', 'tok-text', shownText(t)), el('span', 'tok-id', t.id));
  return c;
}

/** After a chip, a line break for each newline its token holds, so that the text keeps its lines. */
export function lineBreaks(t) {
  return isBlank(t.text) ? [...t.text].filter((ch) => ch === '\n').map(() => document.createElement('br')) : [];
}
