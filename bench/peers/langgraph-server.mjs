// The LangGraph.js peer: a ReAct agent with one tool, ChatOpenAI
// pointed at the mock, the thread kept by a checkpointer (the chat's id
// is the thread), the model's tokens streamed to the client as LangGraph
// Platform streams them (stream mode "messages": an SSE event per
// message chunk, the chunk and its metadata).  The client's last message
// is the new input; the rest is the checkpointer's.
//
//   node langgraph-server.mjs PORT MOCK_PORT react       createReactAgent,
//                                                        MemorySaver
//   node langgraph-server.mjs PORT MOCK_PORT agent DB    createAgent,
//                                                        SqliteSaver(DB)

import { tool } from '@langchain/core/tools';
import { ChatOpenAI } from '@langchain/openai';
import { MemorySaver } from '@langchain/langgraph';
import { createReactAgent } from '@langchain/langgraph/prebuilt';
import { z } from 'zod';

import { serve } from './serve.mjs';

const port = Number(process.argv[2]);
const mock = Number(process.argv[3]);
const kind = process.argv[4] || 'react';
const db = process.argv[5];

const model = new ChatOpenAI({
    model: 'gpt-mock',
    apiKey: 'none',
    streaming: true,
    configuration: { baseURL: `http://127.0.0.1:${mock}/v1` },
});

const getWeather = tool(async ({ city }) => JSON.stringify({
    city, temp: 21, sky: 'clear',
}), {
    name: 'get_weather',
    description: 'The weather in a city',
    schema: z.object({ city: z.string() }),
});

const prompt = 'You are terse.';
let agent;

if (kind === 'agent') {
    const { createAgent } = await import('langchain');
    const { SqliteSaver } = await import(
        '@langchain/langgraph-checkpoint-sqlite');

    agent = createAgent({
        model, tools: [getWeather], systemPrompt: prompt,
        checkpointer: SqliteSaver.fromConnString(db),
    });

} else {
    agent = createReactAgent({
        llm: model, tools: [getWeather], prompt,
        checkpointer: new MemorySaver(),
    });
}

function text(message) {
    const t = (message.parts || []).find((p) => p.type === 'text');
    return t ? t.text : '';
}

async function chat(req, res, body) {
    const { id, messages } = JSON.parse(body);
    const input = text(messages[messages.length - 1]);

    const stream = await agent.stream(
        { messages: [{ role: 'user', content: input }] },
        { configurable: { thread_id: id }, streamMode: 'messages' });

    res.writeHead(200, {
        'Content-Type': 'text/event-stream',
        'Cache-Control': 'no-cache',
    });

    for await (const [chunk, meta] of stream) {
        res.write('event: messages\ndata: '
                  + JSON.stringify([chunk, meta]) + '\n\n');
    }

    res.end('event: end\ndata: null\n\n');
}

serve(port, `langgraph ${kind}`, chat);
