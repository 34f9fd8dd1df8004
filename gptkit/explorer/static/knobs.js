/* The sampling knobs above the text: temperature, top-k, top-p, seed, max tokens, stop text. */

import { $ } from './dom.js';

export function numberField(id, what, integer) {
  const raw = $(id).value.trim();
  const v = Number(raw);
  if (raw === '' || !Number.isFinite(v)) return { error: `${what}: type a number` };
  if (integer && !Number.isInteger(v)) return { error: `${what}: type a whole number` };
  return { value: v };
}

/** temperature, top_k, top_p as typed; the server checks their ranges and says what is wrong. */
export function readKnobs() {
  const t = numberField('#temperature', 'temperature', false);
  const k = numberField('#top-k', 'top-k', true);
  const p = numberField('#top-p', 'top-p', false);
  const bad = [t, k, p].find((f) => f.error);
  if (bad) return { error: bad.error };
  return { temperature: t.value, top_k: k.value, top_p: p.value };
}

export function knobsInWords(k) {
  return `temperature ${k.temperature} · top-k ${k.top_k === 0 ? 'off' : k.top_k} · top-p ${k.top_p}`;
}

/** The stop text as sample.py reads --stop: \n, \t, \r and \\ stand for the characters. */
export function stopText() {
  const map = { n: '\n', t: '\t', r: '\r', '\\': '\\' };
  return $('#stop-text').value.replace(/\\([ntr\\])/g, (_, c) => map[c]);
}

/** Keep a slider and its number box in step; onChange runs after either moves. */
export function linkSlider(rangeId, numberId, onChange) {
  const range = $(rangeId);
  const num = $(numberId);
  range.addEventListener('input', () => {
    num.value = range.value;
    onChange();
  });
  num.addEventListener('input', () => {
    const v = Number(num.value);
    if (num.value.trim() !== '' && Number.isFinite(v)) range.value = String(v);
    onChange();
  });
}
