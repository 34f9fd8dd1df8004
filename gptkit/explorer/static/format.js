/* How numbers, tokens and heads are written on the page. */

const missing = (x) => x === null || x === undefined || !Number.isFinite(x);

export function fmtP(p) {
  if (missing(p)) return '—';
  if (p === 0) return '0%';
  const pct = p * 100;
  if (pct >= 10) return pct.toFixed(0) + '%';
  if (pct >= 1) return pct.toFixed(1) + '%';
  if (pct >= 0.01) return pct.toFixed(2) + '%';
  return '<0.01%';
}

export const fmtBits = (b) => (missing(b) ? '—' : b.toFixed(2));
/** A feature's value (an SAE's activation), as the Features panel writes every one. */
export const fmtValue = (v) => (missing(v) ? '—' : v.toFixed(3));
export const fmtSigned = (d, digits = 2) => (d > 0 ? '+' : d < 0 ? '−' : '±') + Math.abs(d).toFixed(digits);
export const fmtInt = (n) => (n === null || n === undefined ? '—' : Number(n).toLocaleString('en-US'));
export const plural = (n, word) => `${n} ${word}${n === 1 ? '' : 's'}`;

/** What a chip shows: the token's text, or its visible label when the text is whitespace or empty, or holds
    part of a character (a byte-level BPE cuts some characters between tokens: the text has U+FFFD where the
    label writes those bytes as ⟨e4⟩). */
export const isBlank = (text) => text === '' || /^\s+$/.test(text);
export const partial = (text) => text.includes('\ufffd');
export const shownText = (t) => (isBlank(t.text) || partial(t.text) ? t.label : t.text);
export const quote = (label) => '“' + label + '”';
export const quoted = (t) => quote(t.label);

/* Layers and heads count from 0, as in interpretability papers and plot.py: L0H3 is layer 0, head 3.
   Token positions count from 1 along the text: token 1 is the text's first token. */
export const headName = (layer, head) => `L${layer}H${head}`;
export const tokenNumber = (i) => `token ${i + 1}`;
