// The web page of `diffuse serve` in a real browser (Debian's Chromium driven by
// playwright-core): loads the page, generates an image from a prompt, checks the status panel
// shows the device, cancels a second job, and stops the server with SIGTERM (exit 0).
// Usage: node web_page_test.mjs DIFFUSE_BINARY MODEL_DIR SCREENSHOT_DIR
import { spawn } from 'node:child_process';
import { mkdirSync } from 'node:fs';
import { chromium } from 'playwright-core';

const [binary, model, shots] = process.argv.slice(2);
if (!binary || !model || !shots) {
  console.error('usage: node web_page_test.mjs DIFFUSE_BINARY MODEL_DIR SCREENSHOT_DIR');
  process.exit(2);
}
mkdirSync(shots, { recursive: true });
const browserPath = process.env.CHROMIUM || '/usr/bin/chromium';

function fail(message) {
  console.error(`FAIL: ${message}`);
  process.exitCode = 1;
  throw new Error(message);
}

// Starts the server on a free port; resolves with its URL once it listens.
function startServer() {
  const server = spawn(binary, ['serve', '-m', model, '--port', '0', '--device', 'cpu'], {
    stdio: ['ignore', 'inherit', 'pipe'],
  });
  const url = new Promise((resolve, reject) => {
    let text = '';
    server.stderr.on('data', (chunk) => {
      process.stderr.write(chunk);
      text += chunk.toString();
      // The whole line: a chunk may end in the middle of the address.
      const m = text.match(/diffuse serve: (http:\/\/\S+)[ \n]/);
      if (m) resolve(m[1]);
    });
    server.on('exit', (code) => reject(new Error(`server exited early with ${code}`)));
  });
  return { server, url };
}

const { server, url: urlPromise } = startServer();
const exited = new Promise((resolve) => server.on('exit', (code, signal) => resolve({ code, signal })));
let browser;
try {
  const url = await urlPromise;
  browser = await chromium.launch({ executablePath: browserPath, args: ['--no-sandbox'] });
  const page = await browser.newPage({ viewport: { width: 1280, height: 900 } });
  const consoleErrors = [];
  page.on('console', (m) => m.type() === 'error' && consoleErrors.push(m.text()));
  page.on('pageerror', (e) => consoleErrors.push(String(e)));
  await page.goto(url);

  // The status panel names the device.
  await page.waitForFunction(() => /cpu/.test(document.querySelector('#status-device')?.textContent || ''), null, {
    timeout: 30000,
  });

  // One image from a prompt.
  await page.fill('#prompt', 'a red circle on the left and a blue square on the right on a yellow background');
  await page.fill('#steps', '20');
  await page.fill('#seed', '42');
  await page.click('#generate');
  await page.waitForSelector('#gallery .result img.result-image', { timeout: 120000 });
  const size = await page.$eval('#gallery .result img.result-image', async (img) => {
    if (!img.complete) await new Promise((r) => img.addEventListener('load', r, { once: true }));
    return [img.naturalWidth, img.naturalHeight];
  });
  if (size[0] !== 128 || size[1] !== 128) fail(`result image is ${size[0]}x${size[1]}, expected 128x128`);
  await page.screenshot({ path: `${shots}/web-page.png`, fullPage: true });
  console.log(`screenshot: ${shots}/web-page.png`);
  // The status panel's s/step names the threads the job ran on (refreshed after the job).
  await page.waitForFunction(() => /\d+ threads?/.test(document.querySelector('#status-speed')?.textContent || ''), null, {
    timeout: 30000,
  });

  // Inpainting: the result becomes the init image, a stroke of the mask brush marks the region
  // to repaint, "only the masked area" keeps the rest: every unmasked pixel must come back
  // exactly as it was, and the masked region must change.
  const results = await page.$$eval('#gallery .result', (r) => r.length);
  await page.click('#gallery .result button:text("use as init image")');
  await page.waitForSelector('#mask-box:not([hidden])', { timeout: 30000 });
  await page.waitForFunction(() => document.querySelector('#mask-canvas').width > 0);
  const box = await page.locator('#mask-canvas').boundingBox();
  await page.mouse.move(box.x + box.width * 0.2, box.y + box.height * 0.3);
  await page.mouse.down();
  await page.mouse.move(box.x + box.width * 0.45, box.y + box.height * 0.6, { steps: 12 });
  await page.mouse.up();
  await page.$eval('#strength', (s) => { s.value = '1'; s.dispatchEvent(new Event('input')); });
  await page.fill('#steps', '8');
  await page.click('#generate');
  await page.waitForFunction((n) => document.querySelectorAll('#gallery .result').length > n, results, { timeout: 120000 });
  const check = await page.evaluate(async () => {
    const load = (src) => new Promise((resolve, reject) => {
      const img = new Image();
      img.onload = () => resolve(img);
      img.onerror = reject;
      img.src = src;
    });
    const pixels = (img) => {
      const c = document.createElement('canvas');
      c.width = img.naturalWidth;
      c.height = img.naturalHeight;
      const ctx = c.getContext('2d');
      ctx.drawImage(img, 0, 0);
      return ctx.getImageData(0, 0, c.width, c.height).data;
    };
    const newest = document.querySelector('#gallery .result img.result-image');
    if (!newest.complete) await new Promise((r) => newest.addEventListener('load', r, { once: true }));
    const source = pixels(await load(document.querySelector('#mask-source').src));
    const mask = pixels(await load(maskDataUrl()));
    const out = pixels(newest);
    if (out.length !== source.length) return { error: `sizes differ: ${out.length} vs ${source.length}` };
    let kept = 0, keptChanged = 0, masked = 0, maskedChanged = 0;
    for (let i = 0; i < out.length; i += 4) {
      const same = out[i] === source[i] && out[i + 1] === source[i + 1] && out[i + 2] === source[i + 2];
      if (mask[i] === 0) { ++kept; keptChanged += same ? 0 : 1; } else if (mask[i] === 255) { ++masked; maskedChanged += same ? 0 : 1; }
    }
    return { kept, keptChanged, masked, maskedChanged };
  });
  if (check.error) fail(check.error);
  if (check.kept === 0 || check.masked === 0) fail(`the mask covers nothing or everything: ${JSON.stringify(check)}`);
  if (check.keptChanged !== 0) fail(`${check.keptChanged} of ${check.kept} unmasked pixels changed`);
  if (check.maskedChanged === 0) fail('nothing inside the mask was repainted');
  await page.screenshot({ path: `${shots}/web-page-inpaint.png`, fullPage: true });
  console.log(`inpainting from the page: ${check.kept} unmasked pixels unchanged, ${check.maskedChanged} of ${check.masked} masked pixels repainted`);
  await page.click('#init-clear');

  // A long job, cancelled from the page while it runs.
  const before = await page.$$eval('#gallery .result', (r) => r.length);
  await page.fill('#steps', '150');
  await page.click('#generate');
  // Wait (polling the API from the page) for the job to run, cancel it from the page, and
  // wait for it to end.
  const running = await (
    await page.waitForFunction(async () => (await (await fetch('/v1/status')).json()).queue.running, null, {
      timeout: 60000,
      polling: 50,
    })
  ).jsonValue();
  await page.click('#cancel');
  // Polled from Node (page.evaluate awaits the fetch), until the job has ended.
  let state = null;
  for (const deadline = Date.now() + 60000; Date.now() < deadline; ) {
    state = await page.evaluate(async (id) => (await (await fetch(`/v1/jobs/${id}`)).json()).state, running.id);
    if (state !== 'running' && state !== 'queued') break;
    await new Promise((r) => setTimeout(r, 50));
  }
  if (state !== 'cancelled')
    fail(`the second job ended '${state}', expected cancelled (job ${JSON.stringify(running)})`);
  const after = await page.$$eval('#gallery .result', (r) => r.length);
  if (after !== before) fail('a cancelled job added an image to the gallery');
  await page.screenshot({ path: `${shots}/web-page-cancelled.png`, fullPage: true });
  if (consoleErrors.length) fail(`browser console errors: ${consoleErrors.join(' | ')}`);
  console.log('web page test: generate, status panel, cancel: ok');
} finally {
  if (browser) await browser.close();
  server.kill('SIGTERM');
}
const { code, signal } = await exited;
if (code !== 0) fail(`server exited with ${code} (${signal}) after SIGTERM, expected 0`);
console.log('server stopped on SIGTERM with exit code 0');
