// The diffuse web page: submits jobs to the native API, follows each job's event stream for
// progress and previews, and shows results and the device status.
'use strict';

const $ = (id) => document.getElementById(id);
const state = {
  jobs: [], current: null, initImages: [], lastSeed: null, status: null, editMode: false, defaultsShown: false,
  maskPainted: false, controlImage: null,
};

// ---- API -----------------------------------------------------------------------------------
function headers(extra = {}) {
  const key = localStorage.getItem('diffuse-api-key');
  return key ? { ...extra, Authorization: `Bearer ${key}` } : extra;
}

async function api(path, init = {}) {
  const res = await fetch(path, { ...init, headers: headers(init.headers) });
  const body = await res.json().catch(() => null);
  if (res.status === 401) $('key-box').hidden = false;
  if (!res.ok) {
    const message = body?.error?.message || `${res.status} ${res.statusText}`;
    const err = new Error(message);
    err.status = res.status;
    throw err;
  }
  return body;
}

// EventSource cannot send an Authorization header: the stream is read with fetch.
async function followEvents(id, onEvent) {
  const res = await fetch(`/v1/jobs/${id}/events`, { headers: headers() });
  if (!res.ok || !res.body) throw new Error(`event stream of job ${id}: ${res.status}`);
  const reader = res.body.getReader();
  const decoder = new TextDecoder();
  let buffer = '';
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buffer += decoder.decode(value, { stream: true });
    let end;
    while ((end = buffer.indexOf('\n\n')) >= 0) {
      const block = buffer.slice(0, end);
      buffer = buffer.slice(end + 2);
      let name = 'message', data = '';
      for (const line of block.split('\n')) {
        if (line.startsWith('event: ')) name = line.slice(7);
        else if (line.startsWith('data: ')) data += line.slice(6);
      }
      if (data) onEvent(name, JSON.parse(data));
    }
  }
}

// ---- errors, formatting ------------------------------------------------------------------------
function showError(message) {
  $('error-text').textContent = message;
  $('error').hidden = false;
}
const bytes = (n) => (n >= 1 << 30 ? `${(n / (1 << 30)).toFixed(2)} GiB` : `${(n / (1 << 20)).toFixed(0)} MiB`);
const seconds = (s) => (s < 0 ? '?' : s < 60 ? `${s.toFixed(1)} s` : `${Math.floor(s / 60)} min ${Math.round(s % 60)} s`);

// ---- status panel ------------------------------------------------------------------------------
// The last job's CPU threads, and when other work held the CPUs it needed (the step then slows).
const cpuText = (c) => {
  if (!c || !c.threads) return '';
  const threads = ` · ${c.threads} thread${c.threads > 1 ? 's' : ''}`;
  return c.crowded ? `${threads}, other work held ${c.other_processes.toFixed(1)} of ${c.cpus} CPUs` : threads;
};
async function refreshStatus() {
  try {
    const s = await api('/v1/status');
    state.status = s;
    $('model-name').textContent = `${s.model} · ${s.default_width}×${s.default_height}`;
    $('status-device').textContent = s.device + (s.vae_device !== s.device ? ` (vae ${s.vae_device})` : '');
    $('status-dtype').textContent =
      `${s.dtype} (vae ${s.vae_dtype})` + (s.weights && s.weights !== 'none' ? `, weights ${s.weights}` : '');
    $('status-attention').textContent = s.attention;
    const dev = s.memory.device ? `, device ${bytes(s.memory.device.allocated_bytes)}` : '';
    $('status-memory').textContent = `${bytes(s.memory.rss_bytes)} now, ${bytes(s.memory.peak_rss_bytes)} peak${dev}`;
    $('status-queue').textContent = `${s.queue.running ? 1 : 0} running, ${s.queue.waiting} waiting`;
    const t = s.last_job?.timings;
    $('status-speed').textContent = t ? `${t.s_per_step.toFixed(3)} s${cpuText(t.cpu)}` : '–';
    $('status-uptime').textContent = seconds(s.uptime_s);
    $('width').placeholder = s.default_width;
    $('height').placeholder = s.default_height;
    const select = $('scheduler');
    if (select.options.length === 1)
      for (const name of s.schedulers) select.add(new Option(name, name));
    $('scheduler-box').hidden = s.schedulers.length === 0;
    $('cache-box').hidden = !s.dit_cache;
    if (!state.defaultsShown) {
      // The model's own defaults, once (later refreshes keep what the user typed).
      state.defaultsShown = true;
      $('steps').value = s.default_steps;
      $('guidance').value = s.default_guidance_scale;
      if (s.default_image_guidance_scale !== undefined) $('image-guidance').value = s.default_image_guidance_scale;
    }
    // An editing model (HiDream-E1) edits the uploaded image by the prompt's instruction.
    state.editMode = s.modes.includes('edit') && !s.modes.includes('img2img');
    $('init-legend').textContent = state.editMode ? 'Image to edit (the prompt is the instruction)' : 'Image to image (optional)';
    $('strength-box').hidden = state.editMode;
    $('image-guidance-box').hidden = !state.editMode;
    state.masks = !!s.masks;
    showMaskBox();
    const models = s.controlnets || [];
    const control = $('control-model');
    if (control.options.length === 1) for (const name of models) control.add(new Option(name, name));
    $('control-box').hidden = models.length === 0;
  } catch (e) {
    if (e.status !== 401) $('status-device').textContent = 'unreachable';
  }
}
function scheduleStatus() {
  refreshStatus().finally(() => setTimeout(scheduleStatus, state.current ? 2000 : 10000));
}

// ---- init images -------------------------------------------------------------------------------
// Any image the browser can show becomes a PNG data URL (the server reads PNG only).
function toPngDataUrl(blob) {
  return new Promise((resolve, reject) => {
    const img = new Image();
    img.onload = () => {
      const canvas = document.createElement('canvas');
      canvas.width = img.naturalWidth;
      canvas.height = img.naturalHeight;
      canvas.getContext('2d').drawImage(img, 0, 0);
      URL.revokeObjectURL(img.src);
      resolve(canvas.toDataURL('image/png'));
    };
    img.onerror = () => reject(new Error('this file is not an image the browser can read'));
    img.src = URL.createObjectURL(blob);
  });
}
function setInitImages(urls) {
  state.initImages = urls;
  const thumbs = $('init-thumbs');
  thumbs.replaceChildren(...urls.map((u) => Object.assign(document.createElement('img'), { src: u, alt: 'init image' })));
  resetMask();
}

// ---- mask brush --------------------------------------------------------------------------------
// One source image and a model that takes masks: paint white where to repaint, on a canvas of
// the image's own size laid over it.
function showMaskBox() {
  $('mask-box').hidden = !(state.masks && state.initImages.length === 1);
}
function resetMask() {
  state.maskPainted = false;
  showMaskBox();
  if (state.initImages.length !== 1) return;
  const img = $('mask-source');
  img.onload = () => {
    const canvas = $('mask-canvas');
    canvas.width = img.naturalWidth;
    canvas.height = img.naturalHeight;
    canvas.getContext('2d').clearRect(0, 0, canvas.width, canvas.height);
  };
  img.src = state.initImages[0];
}
function paintAt(event) {
  const canvas = $('mask-canvas');
  const rect = canvas.getBoundingClientRect();
  const x = ((event.clientX - rect.left) * canvas.width) / rect.width;
  const y = ((event.clientY - rect.top) * canvas.height) / rect.height;
  const r = (Number($('brush-size').value) * canvas.width) / rect.width / 2;
  const ctx = canvas.getContext('2d');
  ctx.globalCompositeOperation = $('mask-erase').checked ? 'destination-out' : 'source-over';
  ctx.fillStyle = '#fff';
  ctx.beginPath();
  ctx.arc(x, y, r, 0, 2 * Math.PI);
  ctx.fill();
  if (!$('mask-erase').checked) state.maskPainted = true;
}
function setupMaskBrush() {
  const canvas = $('mask-canvas');
  let down = false;
  canvas.addEventListener('pointerdown', (e) => { down = true; canvas.setPointerCapture(e.pointerId); paintAt(e); });
  canvas.addEventListener('pointermove', (e) => { if (down) paintAt(e); });
  canvas.addEventListener('pointerup', () => { down = false; });
  canvas.addEventListener('pointercancel', () => { down = false; });
  $('mask-clear').onclick = () => {
    canvas.getContext('2d').clearRect(0, 0, canvas.width, canvas.height);
    state.maskPainted = false;
  };
}
// The painted strokes as the server's mask: white on black, at the image's size; undefined when
// nothing is painted.
function maskDataUrl() {
  const canvas = $('mask-canvas');
  if (!state.maskPainted || $('mask-box').hidden) return undefined;
  const alpha = canvas.getContext('2d').getImageData(0, 0, canvas.width, canvas.height).data;
  let any = false;
  for (let i = 3; i < alpha.length && !any; i += 4) any = alpha[i] > 0;
  if (!any) return undefined;
  const out = document.createElement('canvas');
  out.width = canvas.width;
  out.height = canvas.height;
  const ctx = out.getContext('2d');
  ctx.fillStyle = '#000';
  ctx.fillRect(0, 0, out.width, out.height);
  ctx.drawImage(canvas, 0, 0);
  return out.toDataURL('image/png');
}

// ---- jobs --------------------------------------------------------------------------------------
function readForm() {
  const num = (id) => ($(id).value === '' ? undefined : Number($(id).value));
  const base = {
    negative_prompt: $('negative-prompt').value || undefined,
    width: num('width'),
    height: num('height'),
    steps: num('steps'),
    guidance_scale: num('guidance'),
    scheduler: $('scheduler').value || undefined,
    seed: num('seed'),
    num_images: num('num-images'),
    cache: $('cache-box').hidden || $('cache').value === 'off' ? undefined : $('cache').value,
  };
  const text = $('prompt').value.trim();
  const prompts = $('batch-lines').checked ? text.split('\n').map((l) => l.trim()).filter(Boolean) : [text];
  const images = state.initImages.length ? state.initImages : [undefined];
  const mask = maskDataUrl();
  const onlyMasked = mask && $('mask-only').checked && !state.editMode;
  const controlModel = $('control-model').value;
  const controlnets = controlModel && state.controlImage
    ? [{ model: controlModel, image: state.controlImage, scale: Number($('control-scale').value), preprocess: $('control-preprocess').value || undefined }]
    : undefined;
  const bodies = [];
  for (const prompt of prompts)
    for (const init of images)
      bodies.push(init && state.editMode
        ? { ...base, width: undefined, height: undefined, prompt, mode: 'edit', init_image: init, image_guidance_scale: Number($('image-guidance').value), mask }
        : {
            ...base, prompt, init_image: init, strength: init ? Number($('strength').value) : undefined,
            mask: init ? mask : undefined, mask_crop: init && onlyMasked ? 32 : undefined, controlnets,
          });
  return bodies;
}

async function submit(event) {
  event.preventDefault();
  $('error').hidden = true;
  const bodies = readForm();
  for (let i = 0; i < bodies.length; ++i) {
    try {
      const job = await api('/v1/jobs', { method: 'POST', headers: { 'Content-Type': 'application/json' }, body: JSON.stringify(bodies[i]) });
      state.jobs.push(job);
    } catch (e) {
      const left = bodies.length - i;
      showError(e.status === 503 ? `${e.message} (${left} job(s) not submitted)` : e.message);
      break;
    }
  }
  renderQueue();
  if (!state.current) runNext();
}

function renderQueue() {
  const items = state.jobs.map((job) => {
    const li = document.createElement('li');
    li.className = 'queue-item';
    const label = document.createElement('span');
    label.textContent = `${job === state.current ? 'running' : 'waiting'} · ${job.request.prompt[0].slice(0, 48)}`;
    const cancel = Object.assign(document.createElement('button'), { type: 'button', className: 'queue-cancel', textContent: 'cancel' });
    cancel.onclick = () => cancelJob(job.id);
    li.append(label, cancel);
    return li;
  });
  $('queue').replaceChildren(...items);
  $('cancel').disabled = !state.current;
}

async function cancelJob(id) {
  try {
    await api(`/v1/jobs/${id}`, { method: 'DELETE' });
  } catch (e) {
    showError(e.message);
  }
}

function showProgress(job) {
  const p = job.progress;
  $('progress').value = p.total ? p.step / p.total : 0;
  const perStep = p.step ? p.elapsed_s / p.step : 0;
  $('progress-text').textContent = job.state === 'queued'
    ? `waiting (position ${job.position})`
    : `step ${p.step}/${p.total || '?'} · ${Math.round(100 * (p.fraction || 0))} % · ETA ${seconds(p.eta_s)}` +
      (perStep ? ` · ${perStep.toFixed(3)} s/step` : '');
}

// Jobs run one at a time on the server: follow them in submission order.
async function runNext() {
  const job = state.jobs[0];
  state.current = job || null;
  renderQueue();
  if (!job) return;
  let last = job;
  try {
    await followEvents(job.id, (name, data) => {
      last = data;
      showProgress(data);
      if (data.preview) $('preview').src = data.preview;
    });
    if (last.state === 'succeeded') {
      addResults(last);
      if (last.images[0]) $('preview').src = last.images[0].url;
    }
    else if (last.state === 'failed') showError(`job failed: ${last.error}`);
    else if (last.state === 'cancelled') $('progress-text').textContent = 'cancelled';
  } catch (e) {
    showError(e.message);
  }
  state.jobs.shift();
  runNext();
}

function addResults(job) {
  for (const im of job.images) {
    state.lastSeed = im.seed;
    const card = document.createElement('article');
    card.className = 'result';
    const img = Object.assign(document.createElement('img'), { className: 'result-image', src: im.url, alt: im.prompt });
    const meta = document.createElement('div');
    meta.className = 'meta';
    meta.textContent = `${im.prompt} · seed ${im.seed} · ${im.width}×${im.height} · ${job.request.steps} steps · ${job.request.scheduler || 'default'}`;
    const details = document.createElement('details');
    details.append(Object.assign(document.createElement('summary'), { textContent: 'parameters' }),
      Object.assign(document.createElement('pre'), { textContent: im.parameters }));
    const links = document.createElement('div');
    links.className = 'links';
    const download = Object.assign(document.createElement('a'), { href: `${im.url}?download=1`, textContent: 'download', className: 'download' });
    const reuse = Object.assign(document.createElement('button'), { type: 'button', textContent: 'reuse seed' });
    reuse.onclick = () => { $('seed').value = im.seed; };
    const asInit = Object.assign(document.createElement('button'), { type: 'button', textContent: 'use as init image' });
    asInit.onclick = async () => setInitImages([await toPngDataUrl(await (await fetch(im.url, { headers: headers() })).blob())]);
    links.append(download, reuse, asInit);
    card.append(img, meta, details, links);
    $('gallery').prepend(card);
  }
}

// ---- wiring ------------------------------------------------------------------------------------
$('form').addEventListener('submit', submit);
$('cancel').onclick = () => state.current && cancelJob(state.current.id);
$('seed-random').onclick = () => { $('seed').value = ''; };
$('seed-reuse').onclick = () => { if (state.lastSeed !== null) $('seed').value = state.lastSeed; };
$('strength').oninput = () => { $('strength-value').textContent = $('strength').value; };
$('init-clear').onclick = () => { $('init-image').value = ''; setInitImages([]); };
$('init-image').onchange = async () => {
  try {
    setInitImages(await Promise.all([...$('init-image').files].map(toPngDataUrl)));
  } catch (e) {
    showError(e.message);
  }
};
$('control-image').onchange = async () => {
  try {
    const file = $('control-image').files[0];
    state.controlImage = file ? await toPngDataUrl(file) : null;
  } catch (e) {
    showError(e.message);
  }
};
setupMaskBrush();
$('download-all').onclick = () => document.querySelectorAll('#gallery a.download').forEach((a) => a.click());
$('error-close').onclick = () => { $('error').hidden = true; };
$('api-key').onchange = () => { localStorage.setItem('diffuse-api-key', $('api-key').value); $('key-box').hidden = true; refreshStatus(); };
scheduleStatus();
