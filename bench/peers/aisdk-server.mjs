// The Vercel AI SDK peer: a useChat endpoint as the SDK's documentation
// writes it (streamText with a tool, its UI message stream as the
// response), the model an OpenAI-compatible provider pointed at the
// mock.  Stateless, as the SDK is: the client sends the whole chat.
//
//   node aisdk-server.mjs PORT MOCK_PORT

import { convertToModelMessages, isStepCount, streamText, tool } from 'ai';
import { createOpenAICompatible } from '@ai-sdk/openai-compatible';
import { z } from 'zod';

import { serve } from './serve.mjs';

const port = Number(process.argv[2]);
const mock = Number(process.argv[3]);

const provider = createOpenAICompatible({
    name: 'mock',
    baseURL: `http://127.0.0.1:${mock}/v1`,
    apiKey: 'none',
    includeUsage: true,
});

const tools = {
    get_weather: tool({
        description: 'The weather in a city',
        inputSchema: z.object({ city: z.string() }),
        execute: async ({ city }) => ({ city, temp: 21, sky: 'clear' }),
    }),
};

async function chat(req, res, body) {
    const { messages } = JSON.parse(body);

    const result = streamText({
        model: provider.chatModel('gpt-mock'),
        system: 'You are terse.',
        messages: await convertToModelMessages(messages, { tools }),
        tools,
        stopWhen: isStepCount(5),
    });

    result.pipeUIMessageStreamToResponse(res);
}

serve(port, 'aisdk', chat);
