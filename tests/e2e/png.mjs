// PNG images for the e2e tests: the seed's make_png (a 128x128 image, left half red, right
// half blue), byte for byte, and a decompression bomb's header.
import zlib from 'node:zlib';

// The seed's make_png, byte for byte: 8-bit truecolour, filter 0 rows, zlib level 9.
function chunk(tag, data) {
  const len = Buffer.alloc(4);
  len.writeUInt32BE(data.length);
  const body = Buffer.concat([Buffer.from(tag, 'latin1'), data]);
  const crc = Buffer.alloc(4);
  crc.writeUInt32BE(zlib.crc32(body) >>> 0);
  return Buffer.concat([len, body, crc]);
}
function ihdr(w, h) {
  const b = Buffer.alloc(13);
  b.writeUInt32BE(w, 0);
  b.writeUInt32BE(h, 4);
  b.set([8, 2, 0, 0, 0], 8);
  return b;
}
export function makePng(w = 128, h = 128) {
  return makeRegionsPng(w, h, (x) => (x < w / 2 ? [0xff, 0, 0] : [0, 0, 0xff]));
}
// Any 8-bit RGB image, written the same way: pixel(x, y) -> [r, g, b].
export function makeRegionsPng(w, h, pixel) {
  const rows = [];
  for (let y = 0; y < h; y++) {
    const row = Buffer.alloc(1 + 3 * w);
    for (let x = 0; x < w; x++) row.set(pixel(x, y), 1 + 3 * x);
    rows.push(row);
  }
  return Buffer.concat([Buffer.from([0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a]), chunk('IHDR', ihdr(w, h)),
    chunk('IDAT', zlib.deflateSync(Buffer.concat(rows), { level: 9 })), chunk('IEND', Buffer.alloc(0))]);
}
// A header that declares 20000 x 20000 over a few bytes of data: a decompression bomb.
export function bombPng() {
  return Buffer.concat([Buffer.from([0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a]), chunk('IHDR', ihdr(20000, 20000)),
    chunk('IDAT', zlib.deflateSync(Buffer.alloc(16))), chunk('IEND', Buffer.alloc(0))]);
}

export const dataUri = (bytes, type = 'image/png') => `data:${type};base64,${bytes.toString('base64')}`;
