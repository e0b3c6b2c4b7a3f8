// The web page with an editing model (models/demo-edit, HiDream architecture) in a real browser:
// the page switches to edit mode (image guidance instead of strength, the model's defaults),
// uploads a picture drawn by the Stable-Diffusion-architecture demo model (as scripts/demo.sh
// does), edits it by an instruction, and shows the result at the source's size.
// Usage: node web_page_edit_test.mjs DIFFUSE_BINARY EDIT_MODEL_DIR DRAW_MODEL_DIR SCREENSHOT_DIR
import { spawn, spawnSync } from 'node:child_process';
import { mkdirSync } from 'node:fs';
import { chromium } from 'playwright-core';

const [binary, model, drawModel, shots] = process.argv.slice(2);
if (!binary || !model || !drawModel || !shots) {
  console.error('usage: node web_page_edit_test.mjs DIFFUSE_BINARY EDIT_MODEL_DIR DRAW_MODEL_DIR SCREENSHOT_DIR');
  process.exit(2);
}
mkdirSync(shots, { recursive: true });
const source = `${shots}/web-page-edit-source.png`;
const drawn = spawnSync(binary, ['txt2img', '-m', drawModel, '--device', 'cpu', '--seed', '42', '--steps', '20', '--quiet',
  '-p', 'a red circle on the left and a blue square on the right on a yellow background', '-o', source], { stdio: 'inherit' });
if (drawn.status !== 0) {
  console.error(`FAIL: drawing the source image exited with ${drawn.status}`);
  process.exit(1);
}
const browserPath = process.env.CHROMIUM || '/usr/bin/chromium';

function fail(message) {
  console.error(`FAIL: ${message}`);
  process.exitCode = 1;
  throw new Error(message);
}

const server = spawn(binary, ['serve', '-m', model, '--port', '0', '--device', 'cpu'], {
  stdio: ['ignore', 'inherit', 'pipe'],
});
const exited = new Promise((resolve) => server.on('exit', (code, signal) => resolve({ code, signal })));
const urlPromise = new Promise((resolve, reject) => {
  let text = '';
  server.stderr.on('data', (chunk) => {
    process.stderr.write(chunk);
    text += chunk.toString();
    const m = text.match(/diffuse serve: (http:\/\/\S+)[ \n]/);
    if (m) resolve(m[1]);
  });
  server.on('exit', (code) => reject(new Error(`server exited early with ${code}`)));
});

let browser;
try {
  const url = (await urlPromise).replace(/\/$/, '');  // the server prints it with a slash
  const status = await (await fetch(`${url}/v1/status`)).json();
  browser = await chromium.launch({ executablePath: browserPath, args: ['--no-sandbox'] });
  const page = await browser.newPage({ viewport: { width: 1280, height: 900 } });
  const consoleErrors = [];
  page.on('console', (m) => m.type() === 'error' && consoleErrors.push(m.text()));
  page.on('pageerror', (e) => consoleErrors.push(String(e)));
  await page.goto(url);
  // Edit mode, with the model's own defaults.
  await page.waitForSelector('#image-guidance-box:not([hidden])', { timeout: 30000 });
  if (!(await page.isHidden('#strength-box'))) fail('the strength slider is shown for an editing model');
  const steps = await page.inputValue('#steps');
  if (Number(steps) !== status.default_steps) fail(`steps shows ${steps}, the model's default is ${status.default_steps}`);
  const ig = await page.inputValue('#image-guidance');
  if (Number(ig) !== status.default_image_guidance_scale)
    fail(`image guidance shows ${ig}, the model's default is ${status.default_image_guidance_scale}`);

  await page.setInputFiles('#init-image', source);
  await page.waitForSelector('#init-thumbs img', { timeout: 30000 });
  await page.fill('#prompt', 'make the background green');
  await page.fill('#seed', '42');
  await page.click('#generate');
  await page.waitForSelector('#gallery .result img.result-image', { timeout: 120000 });
  const size = await page.$eval('#gallery .result img.result-image', async (img) => {
    if (!img.complete) await new Promise((r) => img.addEventListener('load', r, { once: true }));
    return [img.naturalWidth, img.naturalHeight];
  });
  if (size[0] !== 128 || size[1] !== 128) fail(`edited image is ${size[0]}x${size[1]}, expected 128x128`);
  await page.screenshot({ path: `${shots}/web-page-edit.png`, fullPage: true });
  console.log(`screenshot: ${shots}/web-page-edit.png`);
  if (consoleErrors.length) fail(`browser console errors: ${consoleErrors.join(' | ')}`);
  console.log('web page edit test: edit mode, model defaults, one edit: ok');
} finally {
  if (browser) await browser.close();
  server.kill('SIGTERM');
}
const { code, signal } = await exited;
if (code !== 0) fail(`server exited with ${code} (${signal}) after SIGTERM, expected 0`);
