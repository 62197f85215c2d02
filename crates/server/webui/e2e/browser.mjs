// The chat page in a real browser (headless Chromium driven by playwright-core), against
// real `frink serve` processes that crates/cli/tests/webui.rs starts:
//   node browser.mjs URL KEY_URL KEY VISION_URL IMAGE OUT_DIR
// URL serves the default model and a second name for it (--models-config) with a small
// context; KEY_URL the same model behind --api-key KEY; VISION_URL a vision model with its
// projector file, IMAGE a picture to attach. Each state is screenshotted into OUT_DIR. Prints "browser checks passed" when every check held; exits non-zero otherwise.
import { mkdirSync } from "node:fs";
import { pathToFileURL } from "node:url";

// playwright-core from where the test installed it (PLAYWRIGHT_CORE: its index.mjs).
const { chromium } = await import(process.env.PLAYWRIGHT_CORE ? pathToFileURL(process.env.PLAYWRIGHT_CORE).href : "playwright-core");

const [url, keyUrl, key, visionUrl, image, out] = process.argv.slice(2);
mkdirSync(out, { recursive: true });
const failures = [];
const check = (cond, what) => {
  if (!cond) {
    failures.push(what);
    console.error(`FAILED: ${what}`);
  } else console.log(`ok: ${what}`);
};
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

const browser = await chromium.launch({ executablePath: process.env.CHROMIUM || "/usr/bin/chromium", args: ["--no-sandbox"] });

/** A page with its console errors and failed requests collected (`expected`: statuses allowed per path). */
async function open(base, expected = []) {
  const context = await browser.newContext({ viewport: { width: 1100, height: 800 } });
  const page = await context.newPage();
  const problems = [];
  let bytes = 0;
  page.on("console", (m) => m.type() === "error" && !expected.some((e) => m.text().includes(e.console || "\u0000")) && problems.push(`console: ${m.text()}`));
  page.on("pageerror", (e) => problems.push(`page error: ${e.message}`));
  page.on("requestfailed", (r) => {
    // A stream stopped on purpose is an aborted request.
    if (!(r.failure()?.errorText || "").includes("ERR_ABORTED")) problems.push(`request failed: ${r.url()} ${r.failure()?.errorText}`);
  });
  page.on("response", async (r) => {
    const path = new URL(r.url()).pathname;
    if (r.status() >= 400 && !expected.some((e) => e.path === path && e.status === r.status())) problems.push(`${r.status()} ${path}`);
    if (!path.startsWith("/v1/")) {
      const h = await r.allHeaders().catch(() => ({}));
      bytes += Number(h["content-length"] || 0);
      if (path === "/") check(/script-src 'self'/.test(h["content-security-policy"] || ""), "the page carries its Content-Security-Policy");
    }
  });
  const t0 = Date.now();
  await page.goto(base);
  return { page, context, problems, bytes: () => bytes, t0 };
}

const shot = (page, name) => page.screenshot({ path: `${out}/${name}.png`, fullPage: true });
const lastAnswer = (page) => page.locator(".msg.assistant .body").last();
const answerText = async (page) => (await lastAnswer(page).textContent()) || "";

async function waitIdle(page) {
  await page.locator("#stop").waitFor({ state: "hidden", timeout: 180000 });
}

async function send(page, text) {
  await page.fill("#input", text);
  await page.press("#input", "Enter");
}

// ---- the main server ----
{
  const { page, context, problems, bytes } = await open(url, [{ path: "/v1/chat/completions", status: 400, console: "400" }]);
  await page.waitForSelector("body[data-models=loaded]");
  const ready = Number(await page.evaluate(() => document.body.dataset.ready));
  check(ready < 1000, `interactive ${ready} ms after navigation starts (under 1 s)`);
  check(bytes() < 300 * 1024, `the page's files are ${bytes()} bytes (under 300 KB)`);
  const options = await page.locator("#model option").allTextContents();
  check(options.length >= 2, `the model picker lists ${options.length} models`);
  check(await page.locator("#attach").isHidden(), "no image button for a text-only model");
  await shot(page, "01-empty");

  // A long answer streams in (its text grows), then Stop ends it.
  // Greedy, so the long answer is the same on every run (it does not end early).
  await page.click("#settings-toggle");
  await page.fill("#max_tokens", "600");
  await page.fill("#temperature", "0");
  await page.click("#settings-toggle");
  // (Its greedy answer runs to max_tokens; "Count from 1 to 300, one number per line."
  // ended after 122 tokens on one machine, before Stop could be pressed.)
  await send(page, "Write the numbers from 1 to 500, separated by commas.");
  await page.locator("#stop").waitFor({ state: "visible" });
  const lengths = [];
  for (let i = 0; i < 40 && lengths.filter((l) => l > 0).length < 4; i++) {
    await sleep(150);
    lengths.push((await answerText(page)).length);
  }
  check(await page.locator("#stop").isVisible(), `still streaming after ${lengths.length} looks`);
  const grew = lengths.filter((l, i) => i > 0 && l > lengths[i - 1]).length;
  check(grew >= 2, `the answer grows while it streams (${lengths.join(", ")})`);
  await shot(page, "02-streaming");
  await page.keyboard.press("Escape");
  await waitIdle(page);
  const stopped = (await answerText(page)).length;
  await sleep(500);
  check((await answerText(page)).length === stopped, "nothing arrives after Esc stops the answer");
  // Shift+Enter is a new line, not a message.
  await page.fill("#input", "first line");
  await page.press("#input", "Shift+Enter");
  await page.type("#input", "second line");
  check((await page.inputValue("#input")) === "first line\nsecond line", "Shift+Enter starts a new line");
  check((await page.locator(".msg.user").count()) === 1, "Shift+Enter sends nothing");
  await page.fill("#input", "");
  await shot(page, "03-stopped");

  // Regenerate: a second version of the answer beside the first.
  await page.fill("#max_tokens", "").catch(() => {});
  await page.click("#settings-toggle");
  await page.fill("#max_tokens", "16");
  await page.click("#settings-toggle");
  await page.locator(".msg.assistant .regenerate").last().click();
  await waitIdle(page);
  check(/2\/2/.test((await page.locator(".msg.assistant .who").last().textContent()) || ""), "regenerate makes a second version (2/2)");
  await page.locator(".msg.assistant .prev").last().click();
  check(/1\/2/.test((await page.locator(".msg.assistant .who").last().textContent()) || ""), "the first version is still there (1/2)");
  await shot(page, "04-regenerated");

  // Edit the question: a branch of its own, the old one kept.
  await page.locator(".msg.user .edit").first().click();
  await page.fill(".edit-box", "Name three colours.");
  await page.click("text=Send as a new branch");
  await waitIdle(page);
  check(/2\/2/.test((await page.locator(".msg.user .who").first().textContent()) || ""), "editing a message makes a branch (2/2)");
  check(((await page.locator(".msg.user .body").first().textContent()) || "").includes("Name three colours."), "the branch shows the edited message");
  await shot(page, "05-edited");

  // Reload: the conversation is kept in the browser.
  await page.reload();
  await page.waitForSelector("body[data-models=loaded]");
  check((await page.locator("#conversations li").count()) >= 1, "the conversation is listed after a reload");
  check(((await page.locator(".msg.user .body").first().textContent()) || "").includes("Name three colours."), "its messages are back after a reload");
  await shot(page, "06-reloaded");

  // Another model from the picker answers.
  await page.click("#new-chat");
  await page.selectOption("#model", "second");
  await send(page, "Hi!");
  await waitIdle(page);
  check(((await page.locator(".msg.assistant .who").last().textContent()) || "").includes("second"), "the answer comes from the model picked");
  check((await answerText(page)).length > 0, "the other model answered");
  await shot(page, "07-second-model");

  // A JSON schema: the answer is JSON matching it.
  await page.click("#new-chat");
  await page.click("#settings-toggle");
  await page.fill("#max_tokens", "80");
  await page.fill("#schema", '{"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}');
  await page.click("#settings-toggle");
  await send(page, "Which city is the capital of France? Answer in JSON.");
  await waitIdle(page);
  let parsed = null;
  try {
    parsed = JSON.parse(await answerText(page));
  } catch {}
  check(parsed && typeof parsed.city === "string", `a JSON schema gives JSON matching it: ${await answerText(page)}`);
  await shot(page, "08-json-schema");
  await page.click("#settings-toggle");
  await page.fill("#schema", "");
  await page.click("#settings-toggle");

  // A prompt past the context: the server's refusal is shown.
  await page.click("#new-chat");
  await send(page, "word ".repeat(3000));
  await waitIdle(page);
  const err = (await page.locator("#error").textContent()) || "";
  check(await page.locator("#error").isVisible(), `the server's refusal is shown: ${err.slice(0, 120)}`);
  check(/context/i.test(err), "the refusal names the context");
  await shot(page, "09-refused");

  // Rename, export, delete, import.
  page.once("dialog", (d) => d.accept("Renamed chat"));
  await page.locator("#conversations li .rename").first().click();
  check(((await page.locator("#conversations li .open").first().textContent()) || "") === "Renamed chat", "a conversation is renamed");
  const [download] = await Promise.all([page.waitForEvent("download"), page.click("#export")]);
  const exported = `${out}/exported.json`;
  await download.saveAs(exported);
  const { readFileSync } = await import("node:fs");
  const saved = JSON.parse(readFileSync(exported, "utf8"));
  check(Array.isArray(saved) && saved.some((c) => c.title === "Renamed chat"), "export writes the conversations as JSON");
  const before = await page.locator("#conversations li").count();
  page.once("dialog", (d) => d.accept());
  await page.locator("#conversations li .delete").first().click();
  check((await page.locator("#conversations li").count()) === before - 1, "a conversation is deleted");
  await page.setInputFiles("#import-file", exported);
  await page.waitForFunction((n) => document.querySelectorAll("#conversations li").length === n, before);
  check((await page.locator("#conversations li .open").allTextContents()).includes("Renamed chat"), "import brings the conversation back");

  // Damaged storage (a conversation whose messages are each other's parents, settings
  // that are not JSON): the page still works.
  await page.evaluate(() => {
    const loop = { id: "loop", title: "loop", created: 1, updated: 9e15, leaf: "m1",
      nodes: { m1: { role: "user", parent: "m2", content: "a" }, m2: { role: "assistant", parent: "m1", content: "b" } } };
    localStorage.setItem("frink.conversations.v1", JSON.stringify([loop, ...JSON.parse(localStorage.getItem("frink.conversations.v1"))]));
    localStorage.setItem("frink.settings.v1", "not json");
  });
  await page.reload();
  await page.waitForSelector("body[data-models=loaded]");
  check(await page.locator("#input").isEnabled(), "damaged storage: the page still works");
  check((await page.locator(".msg").count()) >= 1, "damaged storage: the damaged conversation shows what it can");

  // The dark theme follows the system.
  const light = await page.evaluate(() => getComputedStyle(document.body).backgroundColor);
  await page.emulateMedia({ colorScheme: "dark" });
  const dark = await page.evaluate(() => getComputedStyle(document.body).backgroundColor);
  check(light !== dark, `the theme follows the system (${light} → ${dark})`);
  await shot(page, "09b-dark");
  await page.emulateMedia({ colorScheme: "light" });

  // A phone's width.
  await page.setViewportSize({ width: 390, height: 800 });
  await page.click("#open-side");
  await sleep(400); // the list slides in
  await shot(page, "10-phone");
  check(problems.length === 0, `no console errors or failed requests: ${problems.join("; ")}`);
  await context.close();
}

// ---- the server with an API key ----
{
  const { page, context, problems } = await open(keyUrl, [
    { path: "/v1/models", status: 401, console: "401" },
    { path: "/v1/chat/completions", status: 401, console: "401" },
  ]);
  await page.locator("#key-dialog").waitFor({ state: "visible" });
  await shot(page, "11-api-key");
  // Closing the prompt leaves a usable page that says why nothing is listed.
  await page.keyboard.press("Escape");
  await page.waitForSelector("body[data-models=loaded]");
  check(/key/i.test((await page.locator("#error").textContent()) || ""), "a closed key prompt leaves the reason shown");
  // A key with a character HTTP headers cannot carry is refused in the dialog.
  await send(page, "Hi");
  await page.locator("#key-dialog").waitFor({ state: "visible" });
  await page.fill("#key-input", "ключ");
  await page.click("#key-form button[type=submit]");
  check(await page.locator("#key-dialog").isVisible(), "a key that is not ASCII is refused in the dialog");
  await page.fill("#key-input", key);
  await page.click("#key-form button[type=submit]");
  await page.waitForFunction(() => /Answer|Error/.test(document.getElementById("status").textContent), null, { timeout: 120000 });
  check((await page.locator("#model option").count()) >= 1, "with the key the models are listed");
  check((await page.locator(".msg.assistant .body .error").count()) === 0, "with the key a message is answered");
  await shot(page, "12-with-key");
  check(problems.length === 0, `no console errors or failed requests beside the first 401: ${problems.join("; ")}`);
  await context.close();
}

// ---- a vision model: an image attached and answered about ----
{
  const { page, context, problems } = await open(visionUrl);
  await page.waitForSelector("body[data-models=loaded]");
  check(await page.locator("#attach").isVisible(), "an image button for a vision model");
  await page.setInputFiles("#image-file", image);
  await page.locator("#attachments img").waitFor();
  await shot(page, "13-image-attached");
  await send(page, "Describe it.");
  await waitIdle(page);
  check((await page.locator(".msg.user img.attached").count()) === 1, "the message shows its image");
  check((await page.locator(".msg.assistant .body .error").count()) === 0 && (await answerText(page)).length > 0, "the model answers about the image");
  await shot(page, "14-image-answered");
  check(problems.length === 0, `no console errors or failed requests with an image: ${problems.join("; ")}`);
  await context.close();
}

await browser.close();
if (failures.length) {
  console.error(`${failures.length} browser check(s) failed`);
  process.exit(1);
}
console.log("browser checks passed");
