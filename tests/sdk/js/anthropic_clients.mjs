// One call of the Anthropic TypeScript SDK and one of the Vercel AI SDK's Anthropic provider
// through the gateway, each printed as one JSON line: what the client surfaced of the answer.
//
//   node anthropic_clients.mjs GATEWAY_URL RECOVEA_KEY MODEL
//
// Used by tests/sdk/test_anthropic_fidelity.py; installed by scripts/test-sdk (npm ci).

import Anthropic from '@anthropic-ai/sdk';
import { createAnthropic } from '@ai-sdk/anthropic';
import { generateText } from 'ai';

const [gateway, secret, model] = process.argv.slice(2);
if (!gateway || !secret || !model) {
  console.error('usage: node anthropic_clients.mjs GATEWAY_URL RECOVEA_KEY MODEL');
  process.exit(2);
}

const sdk = new Anthropic({ baseURL: gateway, apiKey: secret, maxRetries: 0 });
try {
  const message = await sdk.messages.create({
    model,
    max_tokens: 8,
    messages: [{ role: 'user', content: 'Hi' }],
  });
  console.log(JSON.stringify({ client: '@anthropic-ai/sdk', ok: true, id: message.id }));
} catch (error) {
  console.log(JSON.stringify({ client: '@anthropic-ai/sdk', ok: false, status: error.status, message: error.message }));
}

const vercel = createAnthropic({ baseURL: `${gateway}/v1`, apiKey: secret });
try {
  const result = await generateText({ model: vercel(model), prompt: 'Hi', maxRetries: 0 });
  console.log(JSON.stringify({ client: '@ai-sdk/anthropic', ok: true, text: result.text }));
} catch (thrown) {
  // A retried call would wrap its last error; with no retries it is the API call's own.
  const error = thrown.lastError ?? thrown;
  console.log(JSON.stringify({ client: '@ai-sdk/anthropic', ok: false, status: error.statusCode, message: error.message }));
}
