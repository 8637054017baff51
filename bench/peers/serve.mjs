// The HTTP server both Node peers run: POST /api/chat, its body read
// whole and given to chat(req, res, body), which answers.

import http from 'node:http';

export function serve(port, name, chat) {
    const server = http.createServer((req, res) => {
        if (req.method !== 'POST' || req.url !== '/api/chat') {
            res.writeHead(404);
            res.end();
            return;
        }

        const parts = [];
        req.on('data', (d) => parts.push(d));
        req.on('end', () => {
            chat(req, res, Buffer.concat(parts).toString()).catch((e) => {
                process.stderr.write(`chat: ${e.stack}\n`);
                if (!res.headersSent) {
                    res.writeHead(500);
                }
                res.end();
            });
        });
    });

    server.keepAliveTimeout = 60000;
    server.listen(port, '127.0.0.1', () => {
        process.stdout.write(`${name} listening on ${port}\n`);
    });
}
