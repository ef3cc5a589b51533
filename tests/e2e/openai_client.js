// The official OpenAI Node client (npm `openai`, not written here) against Cascade's HTTP front:
// streams a chat completion and a completion, repeats the chat to see cached tokens reported,
// asks for n seeded choices (each what its seed gives alone, streamed or whole), and checks that
// bad input surfaces as the client's own error types. Prints one line per check
// and exits 1 on the first failure.
//   node openai_client.js http://127.0.0.1:PORT/v1 [NODE_DIR]
'use strict';
const path = require('path');
const nodeDir = process.argv[3] || path.join(__dirname, '../../scripts/node');
const OpenAI = require(require.resolve('openai', {paths: [nodeDir]}));

const baseURL = process.argv[2];
const client = new OpenAI({baseURL, apiKey: 'unused-locally', maxRetries: 0, timeout: 60000});

function check(cond, what) {
  if (!cond) {
    console.error('FAIL: ' + what);
    process.exit(1);
  }
  console.log('ok: ' + what);
}

async function streamChat(messages) {
  const stream = await client.chat.completions.create({
    model: 'tiny',
    messages,
    max_tokens: 12,
    temperature: 0,
    stream: true,
    stream_options: {include_usage: true},
    ignore_eos: true,
  });
  let text = '', finish = null, usage = null, chunks = 0;
  for await (const chunk of stream) {
    chunks++;
    if (chunk.usage) usage = chunk.usage;
    const c = chunk.choices[0];
    if (c && c.delta && c.delta.content) text += c.delta.content;
    if (c && c.finish_reason) finish = c.finish_reason;
  }
  return {text, finish, usage, chunks};
}

async function main() {
  const system = 'You are Cascade\'s test assistant. '.repeat(20);
  const messages =
      [{role: 'system', content: system}, {role: 'user', content: 'What is a prefix cache?'}];
  const first = await streamChat(messages);
  check(first.chunks >= 3, `chat stream delivered ${first.chunks} chunks`);
  check(first.finish === 'length', `chat finish_reason is ${first.finish}`);
  check(first.usage && first.usage.completion_tokens === 12, 'usage counts 12 completion tokens');
  const second = await streamChat(messages);
  const cached = second.usage.prompt_tokens_details.cached_tokens;
  check(cached > 0, `the repeat reports ${cached} cached prompt tokens`);
  check(second.text === first.text, 'the cached repeat streams the same text as the cold one');

  const whole = await client.chat.completions.create({
    model: 'tiny',
    messages,
    max_tokens: 12,
    temperature: 0,
    ignore_eos: true,
  });
  check(whole.choices[0].message.content === first.text, 'non-streamed chat gives the same text');

  const completion = await client.completions.create({
    model: 'tiny',
    prompt: 'Once upon a time',
    max_tokens: 8,
    temperature: 0,
    stream: true,
  });
  let ctext = '', cfinish = null;
  for await (const chunk of completion) {
    if (chunk.choices.length) {
      ctext += chunk.choices[0].text;
      if (chunk.choices[0].finish_reason) cfinish = chunk.choices[0].finish_reason;
    }
  }
  check(cfinish === 'length' || cfinish === 'stop', `completion stream finished (${cfinish})`);

  // n choices: one Generate stream each over the same prompt; with a seed, choice i samples
  // exactly as a request of its own with seed + i would, streamed or whole.
  const sampled = {model: 'tiny', messages, max_tokens: 8, temperature: 0.8, ignore_eos: true};
  const three = await client.chat.completions.create({...sampled, n: 3, seed: 5});
  check(three.choices.length === 3 && three.choices.every((c, i) => c.index === i),
        'n: 3 gives choices 0, 1, 2');
  check(three.usage.completion_tokens === 24, 'usage counts every choice\'s completion tokens');
  for (const i of [0, 2]) {
    const alone = await client.chat.completions.create({...sampled, seed: 5 + i});
    check(alone.choices[0].message.content === three.choices[i].message.content,
          `choice ${i} is what seed ${5 + i} gives alone`);
  }
  const streamed = await client.chat.completions.create({...sampled, n: 3, seed: 5, stream: true});
  const texts = ['', '', ''];
  for await (const chunk of streamed) {
    for (const c of chunk.choices) {
      if (c.delta && c.delta.content) texts[c.index] += c.delta.content;
    }
  }
  check(texts.every((t, i) => t === three.choices[i].message.content),
        'streamed choices interleave to the same three texts');

  // A prompt list: each prompt's choice is what the prompt gives alone.
  const prompts = ['Once upon a time', 'The capital of France is'];
  const listed = await client.completions.create(
      {model: 'tiny', prompt: prompts, max_tokens: 6, temperature: 0, ignore_eos: true});
  check(listed.choices.length === 2 && listed.choices.every((c, i) => c.index === i),
        'a two-prompt list gives choices 0 and 1');
  for (const i of [0, 1]) {
    const alone = await client.completions.create(
        {model: 'tiny', prompt: prompts[i], max_tokens: 6, temperature: 0, ignore_eos: true});
    check(alone.choices[0].text === listed.choices[i].text,
          `listed prompt ${i} gives what it gives alone`);
  }

  const models = await client.models.list();
  check(models.data.length === 1 && models.data[0].id === 'tiny', 'models.list names the model');

  try {
    await client.chat.completions.create({model: 'tiny', messages, temperature: 9});
    check(false, 'temperature 9 was accepted');
  } catch (e) {
    check(
        e instanceof OpenAI.BadRequestError && e.status === 400,
        `bad temperature is the client's BadRequestError (${e.constructor.name}: ${e.message})`);
  }
  try {
    await client.chat.completions.create({model: 'gpt-4o', messages});
    check(false, 'an unknown model was accepted');
  } catch (e) {
    check(e instanceof OpenAI.NotFoundError, `unknown model is NotFoundError (${e.message})`);
  }
  console.log('openai client: all checks passed');
}

main().catch((e) => {
  console.error('FAIL: ' + (e && e.stack ? e.stack : e));
  process.exit(1);
});
