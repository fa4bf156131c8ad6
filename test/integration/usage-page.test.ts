// The usage page (docs/limits.md, "The usage page") in a real browser:
// headless Chromium from the system (Debian's `chromium`), driven by
// playwright-core. A seeded ledger; the chart must show what the ledger
// holds, a filter by key must narrow it, no console error, usable at a
// phone's width. The screenshots are written to test-artifacts/.
import assert from 'node:assert/strict';
import { existsSync, mkdirSync } from 'node:fs';
import { join } from 'node:path';
import { test } from 'node:test';
import { chromium, type Browser } from 'playwright-core';
import { request } from '../support/client.ts';
import { startGateway } from '../support/gateway.ts';
import { startUpstream } from '../support/upstream.ts';
import { startAdmin } from '../../src/process/admin.ts';
import { createKey } from '../../src/keys/manage.ts';
import { createLogger } from '../../src/observe/log.ts';
import { SqliteUsageStore, usagePath } from '../../src/ledger/sqlite-store.ts';
import type { UsageRow } from '../../src/ledger/store.ts';
import { usageRow } from '../support/rows.ts';

const CHROMIUM = process.env.KEYWARD_TEST_CHROMIUM ?? '/usr/bin/chromium';
const ARTIFACTS = join(import.meta.dirname, '..', '..', 'test-artifacts');

const row = (keyId: string, route: string, day: string, requests: number, cost: number): UsageRow => usageRow({ keyId, route, day, requests, cost });
const dayAgo = (n: number): string => new Date(Date.now() - n * 86_400_000).toISOString().slice(0, 10);

test(
  'the usage page in headless Chromium: the chart shows the ledger, a filter by key narrows it, keys near a limit are listed; no console error; a phone can read it',
  { timeout: 120_000 },
  async () => {
    assert.ok(existsSync(CHROMIUM), `a system Chromium at ${CHROMIUM} (Debian: apt-get install chromium; .ci/run installs it)`);
    const up = await startUpstream();
    const gw = await startGateway({ seo: up.url, limits: { quota: '10/day' } });
    const { logger } = createLogger('silent');
    const admin = await startAdmin(
      { host: '127.0.0.1', port: 0 },
      {
        readiness: () => gw.gateway.readiness(),
        metrics: () => gw.gateway.metrics.text(),
        metricsContentType: 'text/plain',
        usage: (p) => gw.gateway.usagePage(p),
      },
      logger,
    );
    let browser: Browser | null = null;
    try {
      // Three seeded keys over 30 days, and the gateway's own key through real requests.
      const alice = await createKey(gw.store, 'alice', { limits: { budgets: { speech: '100/day' } } });
      const bob = await createKey(gw.store, 'bob');
      const ledger = new SqliteUsageStore(usagePath(gw.config.keysFile));
      const seeded: UsageRow[] = [];
      for (let d = 0; d < 30; d++) {
        seeded.push(row(alice.record.id, 'seo', dayAgo(d), 10 + d, 0.05 * (d + 1)));
        if (d % 3 === 0) seeded.push(row(bob.record.id, 'speech', dayAgo(d), 2 * d + 1, 100 * d + 7));
      }
      seeded.push(row(alice.record.id, 'speech', dayAgo(0), 4, 90)); // alice at 90 % of her speech budget today
      await ledger.add(seeded, { gateway: 'seed', seq: 1 });
      for (let i = 0; i < 9; i++) assert.equal((await request(`${gw.url}/seo/v3/x`, { headers: { authorization: `Bearer ${gw.token}` } })).status, 200);
      await gw.gateway.usagePage(new URLSearchParams()); // warm
      // The gateway's own flush: its 9 requests are in the ledger.
      const expectSeoToday = 10 + 9;
      const deadlineAt = Date.now() + 10_000;
      while ((await ledger.rows({ keyId: gw.keyId })).length === 0 && Date.now() < deadlineAt) await new Promise((r) => setTimeout(r, 50));
      await ledger.close();

      // The public listener never serves it.
      assert.equal((await request(`${gw.url}/usage`)).status, 401);

      browser = await chromium.launch({ executablePath: CHROMIUM, args: ['--no-sandbox', '--disable-gpu', '--disable-dev-shm-usage'] });
      const page = await browser.newPage({ viewport: { width: 1024, height: 900 } });
      const problems: string[] = [];
      page.on('console', (m) => {
        if (m.type() === 'error' || m.type() === 'warning') problems.push(m.text());
      });
      page.on('pageerror', (e) => problems.push(e.message));
      const base = `http://127.0.0.1:${admin.port}`;
      const res = await page.goto(`${base}/usage`);
      assert.equal(res?.status(), 200);
      assert.equal(await page.title(), 'keyward usage');
      const bar = async (route: string, day: string, field: 'requests' | 'cost', chart = '#requests-chart'): Promise<number | null> => {
        const v = await page
          .locator(`${chart} rect.bar[data-route="${route}"][data-day="${day}"]`)
          .getAttribute(`data-${field}`, { timeout: 2_000 })
          .catch(() => null);
        return v === null ? null : Number(v);
      };
      // What the chart draws is what the ledger holds, summed over keys.
      assert.equal(await bar('seo', dayAgo(0), 'requests'), expectSeoToday);
      assert.equal(await bar('seo', dayAgo(5), 'requests'), 15);
      assert.equal(await bar('speech', dayAgo(3), 'requests'), 7);
      assert.equal(await bar('speech', dayAgo(0), 'requests'), 1 + 4);
      assert.equal(await bar('speech', dayAgo(6), 'cost', '#cost-speech'), 607);
      // One bar a day and route: seo every day, speech every third day (today's holds bob's and alice's).
      assert.equal(await page.locator('#requests-chart rect.bar').count(), 30 + 10);
      // The day axis: a label a week apart ending today, each under its own day's bar, none outside the chart.
      const ticks = await page.evaluate<
        Array<{ day: string; text: string; left: number; right: number; bar: { left: number; right: number }; chart: { left: number; right: number } }>
      >(`(() => {
      const chart = document.querySelector('#requests-chart svg').getBoundingClientRect();
      const bar = (day) => { const b = document.querySelector('#requests-chart rect.bar[data-route="seo"][data-day="' + day + '"]').getBoundingClientRect(); return { left: b.left, right: b.right }; };
      return [...document.querySelectorAll('#requests-chart .tick')].map((t) => { const r = t.getBoundingClientRect(); return { day: t.dataset.day, text: t.textContent, left: r.left, right: r.right, bar: bar(t.dataset.day), chart: { left: chart.left, right: chart.right } }; });
    })()`);
      assert.deepEqual(
        ticks.map((t) => t.day),
        [28, 21, 14, 7, 0].map(dayAgo),
      );
      for (const t of ticks) {
        assert.equal(t.text, t.day.slice(5));
        assert.ok(t.left >= t.chart.left - 0.5 && t.right <= t.chart.right + 0.5, `the ${t.day} label lies inside the chart`);
        // Centred under its bar, or (today's) ending at the chart's right edge, over today's bar.
        const middle = (t.left + t.right) / 2;
        if (t.day === dayAgo(0)) assert.ok(t.right > t.bar.left, "today's label reaches today's bar");
        else assert.ok(Math.abs(middle - (t.bar.left + t.bar.right) / 2) < 2, `the ${t.day} label is centred under its bar`);
      }
      // Today's top keys and the keys near a limit.
      const topText = await page.locator('h2:has-text("top keys") + table').innerText();
      // Today: alice 10 + 4, the gateway's own key 9, bob 1.
      assert.deepEqual(
        topText
          .split('\n')
          .slice(1)
          .map((l) => [l.split(' ')[0], l.split('\t')[1]]),
        [
          ['alice', '14'],
          ['tester', '9'],
          ['bob', '1'],
        ],
      );
      assert.match(await page.locator('h2:has-text("Near or past") + table').innerText(), /alice[\s\S]*budget speech 100\/day[\s\S]*90 of 100[\s\S]*90 %/);
      assert.match(await page.locator('h2:has-text("Near or past") + table').innerText(), /tester[\s\S]*quota 10\/day[\s\S]*9 of 10/);
      mkdirSync(ARTIFACTS, { recursive: true });
      await page.screenshot({ path: join(ARTIFACTS, 'usage-page.png'), fullPage: true });

      // Filter by key, through the form as a person would.
      await page.fill('input[name="key"]', 'bob');
      await Promise.all([page.waitForURL(/key=bob/), page.click('button[type="submit"]')]);
      assert.match(await page.locator('h1').innerText(), /key bob/);
      assert.equal(await bar('seo', dayAgo(0), 'requests'), null, "alice's and tester's requests are not in bob's chart");
      assert.equal(await bar('speech', dayAgo(3), 'requests'), 7);
      assert.equal(await page.locator('#requests-chart rect.bar').count(), 10);
      // And by route, through a link.
      await Promise.all([page.waitForURL(/route=speech/), page.click('a:text-is("speech")')]);
      assert.equal(await page.locator('#requests-chart rect.bar').count(), 10);

      // The value axis: the top line's value is a round figure at or above the highest day, the mid line half of it; each bar's figure is its tooltip.
      await page.goto(`${base}/usage`);
      const axis = await page.evaluate<string[]>(`[...document.querySelectorAll('#requests-chart .value')].map((v) => v.textContent)`);
      const highest = Math.max(
        ...((await page.locator('#requests-chart rect.bar').evaluateAll((bars) => {
          const perDay = new Map();
          for (const b of bars) perDay.set(b.getAttribute('data-day'), (perDay.get(b.getAttribute('data-day')) ?? 0) + Number(b.getAttribute('data-requests')));
          return [...perDay.values()];
        })) as number[]),
      );
      assert.equal(axis.length, 2, 'a top and a mid value');
      const [topValue, midValue] = axis.map(Number) as [number, number];
      assert.ok(topValue >= highest && topValue < 2.5 * highest, `top ${topValue} for a highest day of ${highest}`);
      assert.equal(midValue, topValue / 2);
      assert.match(String(topValue), /^[125]0*$/, 'a round figure');
      const tips = (await page
        .locator('#requests-chart rect.bar')
        .evaluateAll((bars) =>
          bars.map((b) => [
            b.querySelector('title')?.textContent,
            `${b.getAttribute('data-day')} ${b.getAttribute('data-route')}: ${b.getAttribute('data-requests')}`,
          ]),
        )) as Array<[string, string]>;
      for (const [tip, expected] of tips) assert.equal(tip, expected);
      // A route with nothing in the range says so instead of an empty box; a route that does not exist is named as such.
      await page.goto(`${base}/usage?route=scraper`);
      assert.equal(await page.locator('#requests-chart svg').count(), 0);
      assert.match(await page.locator('#requests-chart').innerText(), /Nothing forwarded on scraper in these 30 days/);
      await page.goto(`${base}/usage?route=bogus`);
      assert.match(await page.locator('h1').innerText(), /no route named bogus/);
      assert.equal(await page.locator('#requests-chart rect.bar').count(), 0, 'nothing shown for a route that does not exist');

      // A phone: nothing wider than the screen but the tables, which scroll inside themselves.
      const phone = await browser.newPage({ viewport: { width: 390, height: 844 }, isMobile: true });
      phone.on('console', (m) => {
        if (m.type() === 'error') problems.push(m.text());
      });
      await phone.goto(`${base}/usage`);
      // Evaluated in the page (a string: this file is not type-checked against the DOM).
      const overflow = await phone.evaluate<number>('document.documentElement.scrollWidth - window.innerWidth');
      assert.ok(overflow <= 0, `the page is ${overflow} px wider than a phone`);
      // The lists of keys fit the screen (no part of a row hidden behind a scroll).
      for (const list of ['top keys', 'Near or past']) {
        const cut = await phone.evaluate<number>(
          `(() => { const t = document.querySelector('h2:nth-of-type(1)') && [...document.querySelectorAll('h2')].find((h) => h.textContent.includes(${JSON.stringify(list)})).nextElementSibling; return t.scrollWidth - t.clientWidth + Math.max(0, t.getBoundingClientRect().right - window.innerWidth); })()`,
        );
        assert.ok(cut <= 1, `the ${list} table is cut by ${cut} px at 390 px`);
      }
      await phone.screenshot({ path: join(ARTIFACTS, 'usage-page-phone.png'), fullPage: true });
      assert.deepEqual(problems, [], 'no console error or warning');
    } finally {
      await browser?.close();
      await admin.close();
      await gw.close();
      await up.close();
    }
  },
);
