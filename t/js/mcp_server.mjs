// An MCP server made with the official TypeScript SDK
// (@modelcontextprotocol/sdk, pinned in package-lock.json), over its
// Streamable HTTP transport with sessions, for t/mcp_sdk.t:
//
//     node mcp_server.mjs PORT [NOTES]
//
// prints "listening" once it accepts.  Tools: add (a structured
// result), count (progress notifications, then a result), fail
// (isError), confirm (asks the client whether to remove path, by
// elicitation on the call's stream, waiting wait ms for the answer, the
// SDK's 60 s if none, and says what it was answered; the answer, or the
// call cancelled meanwhile, is noted, one line in the file NOTES).  A
// session it does not know gets 404, as the transport's specification
// asks, so that a restarted server makes the client initialize again.

import http from 'node:http';
import { appendFileSync } from 'node:fs';
import { randomUUID } from 'node:crypto';

import { Server } from '@modelcontextprotocol/sdk/server/index.js';
import { StreamableHTTPServerTransport }
    from '@modelcontextprotocol/sdk/server/streamableHttp.js';
import { CallToolRequestSchema, ListToolsRequestSchema, isInitializeRequest }
    from '@modelcontextprotocol/sdk/types.js';

const port = Number(process.argv[2]);
const notes = process.argv[3];
const transports = new Map();

const tools = [
    {
        name: 'add',
        description: 'Adds two numbers',
        inputSchema: {
            type: 'object',
            properties: { a: { type: 'number' }, b: { type: 'number' } },
            required: ['a', 'b'],
        },
    },
    {
        name: 'count',
        description: 'Counts to n, reporting progress',
        inputSchema: {
            type: 'object',
            properties: { n: { type: 'integer', minimum: 1 } },
        },
    },
    {
        name: 'fail',
        description: 'Always fails',
        inputSchema: { type: 'object', properties: {} },
    },
    {
        name: 'confirm',
        description: 'Removes a file, once the user confirms',
        inputSchema: {
            type: 'object',
            properties: { path: { type: 'string' } },
        },
    },
];

function note(line) {
    if (notes) {
        appendFileSync(notes, line + '\n');
    }
}

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

function makeServer() {
    const server = new Server({ name: 'sdk-test', version: '1.0.0' },
                              { capabilities: { tools: {} } });

    server.setRequestHandler(ListToolsRequestSchema, async () => ({ tools }));

    server.setRequestHandler(CallToolRequestSchema, async (req, extra) => {
        const { name, arguments: args = {} } = req.params;

        if (name === 'add') {
            const sum = args.a + args.b;
            return { content: [{ type: 'text', text: String(sum) }],
                     structuredContent: { sum } };
        }

        if (name === 'count') {
            const n = args.n ?? 3;
            const token = req.params._meta?.progressToken;

            for (let i = 1; i <= n; i++) {
                if (token !== undefined) {
                    await extra.sendNotification({
                        method: 'notifications/progress',
                        params: { progressToken: token, progress: i,
                                  total: n, message: `step ${i}` },
                    });
                }
                await sleep(300);
            }

            return { content: [{ type: 'text', text: `counted to ${n}` }] };
        }

        if (name === 'confirm') {
            let answer;

            try {
                answer = await server.elicitInput({
                    message: `Remove ${args.path}?`,
                    requestedSchema: {
                        type: 'object',
                        properties: { confirm: { type: 'boolean' } },
                        required: ['confirm'],
                    },
                }, { relatedRequestId: extra.requestId, signal: extra.signal,
                     timeout: args.wait });
            } catch (e) {
                note(`aborted ${extra.requestId}: `
                     + `${extra.signal.aborted ? extra.signal.reason : e}`);
                throw e;
            }

            note(`answered ${extra.requestId}: ${answer.action}`);

            const text = answer.action === 'accept'
                ? `confirmed: ${JSON.stringify(answer.content)}`
                : answer.action === 'decline' ? 'declined' : 'cancelled';

            return { content: [{ type: 'text', text }] };
        }

        if (name === 'fail') {
            return { content: [{ type: 'text', text: 'the disk is full' }],
                     isError: true };
        }

        throw new Error(`unknown tool ${name}`);
    });

    return server;
}

function readBody(req) {
    return new Promise((resolve, reject) => {
        const chunks = [];
        req.on('data', (c) => chunks.push(c));
        req.on('end', () => resolve(Buffer.concat(chunks).toString()));
        req.on('error', reject);
    });
}

function reject(res, status, message) {
    res.writeHead(status, { 'Content-Type': 'application/json' });
    res.end(JSON.stringify({ jsonrpc: '2.0', id: null,
                             error: { code: -32000, message } }));
}

http.createServer(async (req, res) => {
    const sid = req.headers['mcp-session-id'];
    let body;

    if (req.method === 'POST') {
        try {
            body = JSON.parse(await readBody(req));
        } catch {
            return reject(res, 400, 'Parse error');
        }
    }

    let transport = sid ? transports.get(sid) : undefined;

    if (sid && !transport) {
        return reject(res, 404, 'Session not found');
    }

    if (!transport) {
        if (req.method !== 'POST' || !isInitializeRequest(body)) {
            return reject(res, 400, 'No session');
        }

        transport = new StreamableHTTPServerTransport({
            sessionIdGenerator: () => randomUUID(),
            onsessioninitialized: (id) => transports.set(id, transport),
        });

        transport.onclose = () => transports.delete(transport.sessionId);

        await makeServer().connect(transport);
    }

    await transport.handleRequest(req, res, body);
}).listen(port, '127.0.0.1', () => console.log('listening'));
