// Drives the dashboard in headless Chromium (Debian's, through playwright-core) for the
// end-to-end test crates/hawser-e2e/tests/dashboard.rs, one phase per run (the Rust test kills
// and restarts agents between them):
//
//   node dashboard.mjs PHASE
//
// with HAWSER_UI_URL (the controller's https://.../ui/), HAWSER_UI_TOKEN (the admin token)
// and HAWSER_UI_SHOTS (a directory for screenshots). Exits non-zero with a message when an
// expectation fails.

import { chromium } from "playwright-core";

const url = process.env.HAWSER_UI_URL;
const adminToken = process.env.HAWSER_UI_TOKEN;
const shots = process.env.HAWSER_UI_SHOTS;
const phase = process.argv[2];
const TIMEOUT = 60_000;

function fail(msg) {
  console.error(`dashboard ${phase}: ${msg}`);
  process.exit(1);
}

const browser = await chromium.launch({
  executablePath: process.env.CHROMIUM ?? "/usr/bin/chromium",
  args: [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
  ],
});
// The controller's certificate is the cluster CA's, which this browser does not know.
const context = await browser.newContext({
  ignoreHTTPSErrors: true,
  viewport: { width: 390, height: 844 }, // a phone's width: the page must work there too
});
const page = await context.newPage();
page.setDefaultTimeout(TIMEOUT);
page.on("dialog", (d) => d.accept());
const errors = [];
page.on("pageerror", (e) => errors.push(String(e)));
// Refused calls (the wrong token, the bad name) are expected; Chromium logs each as an error.
page.on("console", (m) => {
  if (m.type() === "error" && !m.text().startsWith("Failed to load resource")) errors.push(m.text());
});

async function shot(name) {
  await page.screenshot({ path: `${shots}/${phase}-${name}.png`, fullPage: true });
}

async function login() {
  await page.goto(url);
  await page.fill("#token", adminToken);
  await page.click("#login");
  await page.waitForSelector("#nodes");
}

const row = (volume) => `#volumes tr[data-volume="${volume}"]`;

try {
  switch (phase) {
    case "login": {
      await page.goto(url);
      await page.fill("#token", "not-the-token");
      await page.click("#login");
      await page.waitForSelector(".login .error");
      await login();
      await page.waitForFunction(
        () => document.querySelectorAll("#nodes tbody tr").length === 3 &&
          [...document.querySelectorAll("#nodes .state")].every((td) => td.textContent.startsWith("online")),
      );
      await shot("nodes");
      // A volume created through the page.
      await page.fill("#new-name", "web");
      await page.fill("#new-size", "64MiB");
      await page.selectOption("#new-replicas", "2");
      await page.click("#create");
      await page.waitForSelector(row("web"));
      // A name with HTML in it: refused by the API, and its message shown as text.
      const evil = `<img src=x onerror="window.__xss=1">`;
      await page.fill("#new-name", evil);
      await page.click("#create");
      await page.waitForFunction((e) => document.querySelector("#message")?.textContent.includes(e), evil);
      const injected = await page.evaluate(() => ({
        img: document.querySelectorAll("#message img, main img").length,
        xss: window.__xss ?? null,
      }));
      if (injected.img !== 0 || injected.xss !== null) fail(`HTML was rendered: ${JSON.stringify(injected)}`);
      await shot("created");
      break;
    }
    case "io": {
      // The test writes the volume while this phase runs: the live rate shows it.
      await login();
      // At least two rates (three looks) drawn, the latest with requests in it.
      await page.waitForFunction(
        (sel) =>
          /^[1-9]\d* IOPS$/.test(document.querySelector(`${sel} .iops-now`)?.textContent ?? "") &&
          (document.querySelector(`${sel} .spark.iops polyline`)?.getAttribute("points") ?? "").split(" ").length >= 2,
        row("web"),
      );
      const latency = await page.textContent(`${row("web")} .latency-now`);
      if (!/^\d+\.\d\d ms$/.test(latency)) fail(`no latency shown: ${latency}`);
      await shot("io");
      console.log(`live I/O on the page: ${await page.textContent(`${row("web")} .io`)}`);
      break;
    }
    case "degraded": {
      await login();
      await page.waitForSelector(`${row("web")}.degraded`);
      await page.waitForFunction(() => document.querySelector("#summary")?.textContent.includes("2/3 nodes online"));
      // The recent events tell why: the replica outdated, its node silent.
      await page.waitForSelector(`#events tr.warning[data-reason="Degraded"]:has-text("volume web")`);
      await page.waitForSelector(`#events tr.warning[data-reason="NodeSilent"]`);
      // Usable on a phone: nothing wider than the screen.
      const overflow = await page.evaluate(() => document.documentElement.scrollWidth - window.innerWidth);
      if (overflow > 0) fail(`the page is ${overflow}px wider than a phone's screen`);
      await shot("degraded");
      break;
    }
    case "resync": {
      await login();
      // The test's agents resync slowly (a few MiB/s), so the copy is in progress for several
      // polls: its row and progress bar must show before the volume is whole again.
      const resync = `#resyncs tr[data-volume="web"]`;
      await page.waitForSelector(resync, { timeout: 30_000 });
      const first = await page.textContent(resync);
      if (!/ of /.test(first)) fail(`no progress on the resync row: ${first}`);
      await shot("progress");
      console.log(`resync progress on the page: ${first}`);
      await page.waitForFunction(
        (sel) => {
          const r = document.querySelector(sel);
          return r && !r.classList.contains("degraded") && r.textContent.includes("2/2 in sync");
        },
        row("web"),
      );
      await page.waitForFunction(() => !document.querySelector(`#resyncs tr[data-volume="web"]`));
      await page.waitForSelector(`#events tr[data-reason="Resynced"]:has-text("volume web")`);
      await page.waitForSelector(`#events tr[data-reason="NodeBack"]`);
      await shot("resynced");
      break;
    }
    case "backups": {
      await login();
      // The test's controller lets a backup read 2 MiB/s, so it runs for several polls: its
      // row shows progress, then the recovery point once it is ready.
      const running = `#backups tr[data-state="running"]`;
      await page.waitForSelector(running, { timeout: 30_000 });
      const first = await page.textContent(running);
      if (!/ of /.test(first)) fail(`no progress on the backup row: ${first}`);
      await shot("progress");
      console.log(`backup progress on the page: ${first}`);
      const ready = `#backups tr[data-state="ready"]`;
      await page.waitForSelector(ready);
      const done = await page.textContent(ready);
      if (!/recovery point \d{4}-\d\d-\d\dT/.test(done)) fail(`no recovery point: ${done}`);
      if (!done.includes("web → local")) fail(`not web's backup to local: ${done}`);
      await page.waitForSelector(`#events tr[data-reason="BackupReady"]`);
      await shot("ready");
      break;
    }
    case "delete": {
      await login();
      await page.click(`${row("web")} button:text("detach")`);
      await page.waitForFunction((sel) => document.querySelector(sel)?.textContent.includes("detached"), row("web"));
      await page.click(`${row("web")} button[data-action="delete"]`);
      await page.waitForFunction((sel) => !document.querySelector(sel), row("web"));
      await shot("deleted");
      break;
    }
    default:
      fail(`unknown phase ${phase}`);
  }
  if (errors.length) fail(`errors in the page: ${errors.join("; ")}`);
} catch (e) {
  await shot("failure").catch(() => {});
  fail(String(e));
} finally {
  await browser.close();
}
