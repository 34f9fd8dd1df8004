/* What more than one panel reads or changes. A panel's own bookkeeping (its chart, its request counters)
   stays in its module. */

import { fmtInt } from './format.js';

export const state = {
  runs: [], // GET /api/runs: every run in the folder
  run: null, // the picked run's name
  info: null, // GET /api/runs/{name}: the picked run's model
  infoPromise: null, // that request while it runs
  pickSeq: 0, // counts run picks, so that an answer for an earlier pick is dropped
  chat: false, // the picked run is a chat run: the Write panel takes a question and streams the answer
  chips: [], // the tokens written: {id, text, label, p, p_shaped, gen}
  pinned: null, // index of the clicked token
  shown: null, // what the inspector panels show: {index, idsKey, key, window, data}
  selectedHead: null, // {layer, head} whose whole map is open
  off: [], // the parts switched off ('L0H3', 'MLP1', 'blocks.1.hook_resid_post F12'): every request carries them,
  // the server keeps none
  saes: [], // the hook points at which the picked run has an SAE (GET /api/runs/{name}), in the model's order
  labels: null, // GET /api/runs/{name}/heads: what each head of the picked run does most
  checkpoint: null, // the weights the panels read: 'iter:1200' (a snapshot the Over training slider is at), or null
  // for the run's own checkpoint; every request of those panels carries it, the server keeps none
};

/** body with the checkpoint the panels read, for the requests that follow the Over training slider. */
export function atStep(body) {
  return state.checkpoint ? { ...body, checkpoint: state.checkpoint } : body;
}

/** ' at step 1,200' while the panels read a snapshot, else '': for the lines that name what was asked. */
export function stepWords() {
  return state.checkpoint ? ` at step ${fmtInt(Number(state.checkpoint.slice(5)))}` : '';
}
