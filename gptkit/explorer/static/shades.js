/* The shades that stand for numbers: display mappings only, each explained by a legend on the page. */

import { $, clamp01, el } from './dom.js';

export const PROB_RGB = '47, 95, 179';
export const ATT_RGB = '75, 63, 168';
export const SURPRISE_RGB = '214, 104, 24';
export const BETTER_RGB = '22, 128, 160';
export const WORSE_RGB = '196, 40, 92';
export const FEATURE_RGB = '21, 128, 61';

export const probAlpha = (p) => 0.04 + 0.86 * clamp01(p);
// the square root lifts small weights: a head spreading its attention over many tokens still shows where
export const attAlpha = (w) => 0.92 * Math.sqrt(clamp01(w));
export const SURPRISE_FULL = 10; // bits at which the surprise shade is at its darkest
export const surpriseAlpha = (b) => 0.04 + 0.86 * clamp01(b / SURPRISE_FULL);
const DIFF_FULL = 4; // bits of difference at which the difference shade is at its darkest
export const diffAlpha = (d) => 0.06 + 0.84 * clamp01(Math.abs(d) / DIFF_FULL);
// a feature's value as a share of its largest in the text shown: the darkest shade is where it fires most
export const featureAlpha = (share) => 0.06 + 0.84 * clamp01(share);
export const rgba = (rgb, a) => `rgba(${rgb}, ${a.toFixed(3)})`;

/** Shade a token's box; text on a dark shade turns white. */
export function shade(node, rgb, alpha) {
  node.style.background = rgba(rgb, alpha);
  node.classList.toggle('dark', alpha > 0.5);
}

export function swatch(text, rgb, alpha) {
  const s = el('span', 'swatch', text);
  shade(s, rgb, alpha);
  return s;
}

const percent = (x) => Math.round(100 * x) + '%';

export function drawLegends() {
  const prob = $('#prob-swatches');
  for (const p of [0.01, 0.1, 0.3, 0.6, 0.9]) prob.append(swatch(percent(p), PROB_RGB, probAlpha(p)));
  prob.title = 'light = the model found the token unlikely (a surprise); dark = it expected it';
  const att = $('#att-swatches');
  for (const w of [0.01, 0.05, 0.2, 0.5, 1]) att.append(swatch(percent(w), ATT_RGB, attAlpha(w)));
  const sur = $('#surprise-swatches');
  for (const b of [0.5, 1, 2, 4, 7, SURPRISE_FULL]) {
    const words = b === SURPRISE_FULL ? `${b}+ bits` : b === 1 ? '1 bit' : `${b} bits`;
    sur.append(swatch(words, SURPRISE_RGB, surpriseAlpha(b)));
  }
}
