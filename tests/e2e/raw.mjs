// Raw TCP clients for the HTTP-layer tests: byte-exact requests (pipelined, malformed,
// trickled) that fetch() cannot send, and the answers as the server wrote them.
import net from 'node:net';

// Sends `bytes` (string or Buffer) and resolves with everything received until the server
// closes or `idleMs` passes without a byte (then the socket is closed by us).
export function rawExchange(port, bytes, { idleMs = 3000, host = '127.0.0.1' } = {}) {
  return new Promise((resolve) => {
    const sock = net.connect(port, host);
    const chunks = [];
    let timer;
    const t0 = Date.now();
    const done = (how) => { clearTimeout(timer); sock.destroy(); resolve({ text: Buffer.concat(chunks).toString('latin1'), how, ms: Date.now() - t0 }); };
    const arm = () => { clearTimeout(timer); timer = setTimeout(() => done('idle'), idleMs); };
    sock.on('connect', () => { sock.write(bytes); arm(); });
    sock.on('data', (d) => { chunks.push(d); arm(); });
    sock.on('end', () => done('closed'));
    sock.on('error', () => done('error'));
  });
}

// The status codes of every HTTP response in a byte stream, in order.
export function statuses(text) {
  return [...text.matchAll(/HTTP\/1\.1 (\d{3}) /g)].map((m) => Number(m[1]));
}

// A connection that sends `bytes` one byte every `everyMs` (a slowloris client). Its
// `closedAt` is set when the server closes it.
export function trickle(port, bytes, everyMs, { prefix = '' } = {}) {
  const sock = net.connect(port, '127.0.0.1');
  const state = { sock, sent: 0, closedAt: null, opened: Date.now(), received: '' };
  let timer = null;
  sock.on('connect', () => {
    if (prefix) sock.write(prefix);
    timer = setInterval(() => {
      if (state.sent >= bytes.length || sock.destroyed) return clearInterval(timer);
      sock.write(bytes.slice(state.sent, state.sent + 1));
      state.sent += 1;
    }, everyMs);
  });
  sock.on('data', (d) => { state.received += d.toString('latin1'); });
  const closed = () => { clearInterval(timer); if (state.closedAt === null) state.closedAt = Date.now(); };
  sock.on('close', closed);
  sock.on('error', closed);
  state.stop = () => { clearInterval(timer); sock.destroy(); };
  return state;
}

// Resident memory of a process in MiB (Linux).
import { readFileSync } from 'node:fs';
export function rssMiB(pid) {
  const m = readFileSync(`/proc/${pid}/status`, 'utf8').match(/VmRSS:\s+(\d+) kB/);
  return m ? Number(m[1]) / 1024 : NaN;
}
