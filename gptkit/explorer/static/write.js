/* Write: the prompt goes to POST /api/generate and the model's tokens stream back (server-sent events),
   each shown as a chip shaded by the probability the model gave it; written by the weights the Over training
   slider picked, if it picked a snapshot. For a chat run the prompt is a question: the server wraps it in the
   chat template (<|user|>question<|assistant|>) and the answer ends where the model writes <|end|>. */

import { ApiError, reach, refusal } from './api.js';
import { $, el, placeholder, setLine } from './dom.js';
import { lineBreaks, named, showsIds, tokenChip } from './chips.js';
import { forgetToken } from './features.js';
import { fmtP, plural } from './format.js';
import { clearInspector } from './inspector.js';
import { numberField, readKnobs, stopText } from './knobs.js';
import { PROB_RGB, probAlpha, shade } from './shades.js';
import { atStep, state, stepWords } from './state.js';
import { offList } from './switches.js';

let gen = null; // the AbortController of the running generation; its `why` says who stopped it

export function clearOutput(message) {
  state.chips = [];
  placeholder($('#output'), 'The prompt\'s tokens and the model\'s tokens appear here. Hover a token to see why it was written; click to pin it.');
  if (message) setLine('#status', message);
  clearInspector();
  forgetToken('written text');
}

export function stopGeneration(why) {
  if (gen) {
    gen.why = why;
    gen.abort();
  }
}

function setGenerating(on) {
  $('#stop').disabled = !on;
  const verb = state.chat ? 'Ask' : 'Generate';
  $('#generate').textContent = on ? verb + ' again' : verb;
}

/** The Write panel for the picked run: a chat run's takes a question, any other's the start of a text. */
export function setChat(on) {
  state.chat = Boolean(on);
  $('#prompt-name').textContent = state.chat ? 'Question' : 'Prompt';
  $('#prompt').placeholder = state.chat
    ? 'A chat run: ask it something; it answers after <|user|>your question<|assistant|> and stops at <|end|>.'
    : 'Type the start of a text; the model continues it. Empty starts from a newline, as sample.py does.';
  if (!gen) setGenerating(false);
}

/** The body of POST /api/generate from the page's fields, or {error} saying which field is wrong. */
function generationRequest() {
  const knobs = readKnobs();
  const seed = numberField('#seed', 'seed', true);
  const maxTokens = numberField('#max-tokens', 'max tokens', true);
  const bad = [knobs, seed, maxTokens].find((f) => f.error);
  if (bad) return { error: bad.error };
  const typed = $('#prompt').value;
  if (state.chat && typed.trim() === '') return { error: 'type a question first' };
  return atStep({
    run: state.run,
    ...(state.chat ? { chat: true } : {}),
    prompt: typed === '' ? '\n' : typed, // sample.py's default start
    temperature: knobs.temperature,
    top_k: knobs.top_k,
    top_p: knobs.top_p,
    seed: seed.value,
    max_tokens: maxTokens.value,
    stop: stopText(),
    off: offList(),
  });
}

export async function generate() {
  if (!state.run) return setLine('#status', 'pick a run first (in the list on the left)', true);
  const fromNewline = !state.chat && $('#prompt').value === '';
  const body = generationRequest();
  if (body.error) return setLine('#status', body.error, true);
  stopGeneration('restart');
  const ctrl = new AbortController();
  gen = ctrl;
  if (!state.info && state.infoPromise) {
    setLine('#status', 'loading the model…');
    await state.infoPromise; // a failed load said so in the run's card; generating may still work, or say why not
    if (gen !== ctrl) return;
  }
  clearOutput(null);
  setGenerating(true);
  const without = stepWords() + (body.off.length ? ` with ${body.off.join(', ')} off` : '');
  const doing = state.chat ? 'answering' : fromNewline ? 'generating from a newline (the prompt is empty)' : 'generating';
  setLine('#status', doing + without + '…');
  const counter = { tokens: 0, ended: false };
  try {
    await stream(body, ctrl.signal, counter);
    if (!counter.ended) setLine('#status', `the stream ended early, after ${plural(counter.tokens, 'token')}`, true);
  } catch (e) {
    if (e && e.name === 'AbortError') {
      if (ctrl.why === 'user') setLine('#status', `stopped after ${plural(counter.tokens, 'token')}`);
    } else if (e instanceof ApiError) {
      setLine('#status', e.message, true);
    } else {
      setLine('#status', 'the stream broke off: ' + (e && e.message ? e.message : e), true);
    }
  } finally {
    if (gen === ctrl) {
      gen = null;
      setGenerating(false);
    }
  }
}

/** Read the event stream of one generation, handing each event to handleEvent as it arrives. */
async function stream(body, signal, counter) {
  const res = await reach('/api/generate', {
    method: 'POST',
    headers: { 'Content-Type': 'application/json', Accept: 'text/event-stream' },
    body: JSON.stringify(body),
    signal,
  });
  if (!res.ok) throw await refusal(res);
  if (!res.body || !res.body.getReader) throw new ApiError('this browser cannot read a streamed response');
  const reader = res.body.getReader();
  const decoder = new TextDecoder();
  let buf = '';
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buf += decoder.decode(value, { stream: true });
    let m;
    while ((m = /\r?\n\r?\n/.exec(buf)) !== null) {
      handleEvent(buf.slice(0, m.index), counter);
      buf = buf.slice(m.index + m[0].length);
    }
  }
  buf += decoder.decode();
  if (buf.trim()) handleEvent(buf, counter);
}

/** One server-sent event: its `data:` lines joined, parsed as JSON. */
function handleEvent(block, counter) {
  const data = block
    .split(/\r?\n/)
    .filter((line) => line.startsWith('data:'))
    .map((line) => line.slice(5).replace(/^ /, ''))
    .join('\n');
  if (!data) return;
  let ev;
  try {
    ev = JSON.parse(data);
  } catch (_) {
    setLine('#status', 'the server sent an event this page cannot read', true);
    return;
  }
  if (ev.type === 'prompt') {
    addChips((ev.tokens || []).map((t) => ({ id: t.id, text: t.text, label: t.label, gen: false })));
  } else if (ev.type === 'token') {
    counter.tokens++;
    addChips([{ id: ev.id, text: ev.text, label: ev.label, p: ev.p, p_shaped: ev.p_shaped, gen: true }]);
    setLine('#status', `generating… ${plural(counter.tokens, 'token')}`);
  } else if (ev.type === 'done') {
    counter.ended = true;
    const reasons = { stop: 'it reached the stop text', max_tokens: 'it reached max tokens', end: 'the model wrote <|end|>, the end of its answer' };
    const why = reasons[ev.reason] || ev.reason;
    setLine('#status', `done: ${plural(counter.tokens, 'token')}, ended because ${why}. Hover or click a token.`);
  } else if (ev.type === 'error') {
    counter.ended = true;
    setLine('#status', ev.error || 'the generation failed', true);
  }
}

function addChips(tokens) {
  const out = $('#output');
  const hint = out.querySelector('.placeholder');
  if (hint) hint.remove();
  const atBottom = out.scrollHeight - out.scrollTop - out.clientHeight < 40;
  const frag = document.createDocumentFragment();
  for (const t of tokens) {
    const i = state.chips.length;
    state.chips.push(t);
    frag.append(makeChip(t, i), ...lineBreaks(t));
  }
  out.append(frag);
  if (atBottom) out.scrollTop = out.scrollHeight;
}

function makeChip(t, i) {
  const c = tokenChip(t, 'chip ' + (t.gen ? 'gen' : 'prompt'), showsIds(state.info && state.info.tokenizer_kind));
  c.dataset.index = String(i);
  if (t.gen) {
    shade(c, PROB_RGB, probAlpha(t.p));
    c.title = `${named(t)}: the model gave it ${fmtP(t.p)}; after temperature/top-k/top-p ${fmtP(t.p_shaped)}`;
  } else {
    c.title = `${named(t)}: a token of your ${state.chat ? 'question, in the chat template' : 'prompt'}`;
  }
  return c;
}
