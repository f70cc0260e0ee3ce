// The OpenAI TypeScript SDK (`openai`) through the gateway: each CALL named on the command line made
// once, in order, and printed as one JSON line: what the client surfaced of the answer, or of the
// error it raised.
//
//   node openai_clients.mjs GATEWAY_URL RECOVEA_KEY MODEL CALL...
//
// CALLs: `chat` (a chat completion), `stream` (a streamed one, with `include_usage`), `models`
// (models.list), and `azure-chat`, `azure-stream` (the same through the `AzureOpenAI` client, MODEL
// as its deployment, api-version AZURE_API_VERSION).
//
// Used by tests/sdk/test_openai_typescript.py; installed by scripts/test-sdk (npm ci).

import OpenAI, { AzureOpenAI } from 'openai';

const AZURE_API_VERSION = '2024-10-21';

const [gateway, secret, model, ...calls] = process.argv.slice(2);
if (!gateway || !secret || !model || calls.length === 0) {
  console.error('usage: node openai_clients.mjs GATEWAY_URL RECOVEA_KEY MODEL CALL...');
  process.exit(2);
}

const options = { apiKey: secret, maxRetries: 0, timeout: 30_000 };
const openai = new OpenAI({ baseURL: `${gateway}/v1`, ...options });
const azure = new AzureOpenAI({ endpoint: gateway, apiVersion: AZURE_API_VERSION, deployment: model, ...options });
const messages = [{ role: 'user', content: 'Say hello' }];

async function chat(client) {
  const { data, request_id } = await client.chat.completions.create({ model, messages }).withResponse();
  return { request_id, text: data.choices[0].message.content, usage: data.usage };
}

async function stream(client) {
  const { data, request_id } = await client.chat.completions
    .create({ model, messages, stream: true, stream_options: { include_usage: true } })
    .withResponse();
  let text = '';
  const usage = [];
  for await (const chunk of data) {
    text += chunk.choices[0]?.delta?.content ?? '';
    if (chunk.usage) usage.push(chunk.usage);
  }
  return { request_id, text, usage };
}

async function models(client) {
  const { data, request_id } = await client.models.list().withResponse();
  const ids = [];
  for await (const item of data) ids.push(item.id);
  return { request_id, ids };
}

const made = {
  chat: () => chat(openai),
  stream: () => stream(openai),
  models: () => models(openai),
  'azure-chat': () => chat(azure),
  'azure-stream': () => stream(azure),
};

for (const call of calls) {
  if (!made[call]) {
    console.error(`unknown call: ${call}`);
    process.exit(2);
  }
  try {
    console.log(JSON.stringify({ call, ok: true, ...(await made[call]()) }));
  } catch (error) {
    if (!(error instanceof OpenAI.APIError)) throw error;
    console.log(
      JSON.stringify({
        call,
        ok: false,
        class: error.constructor.name,
        status: error.status,
        code: error.code,
        type: error.type,
        message: error.message,
        error: error.error,
        request_id: error.requestID,
        headers: Object.fromEntries(error.headers ?? []),
      }),
    );
  }
}
