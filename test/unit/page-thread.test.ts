// The usage page's thread (src/views/page-thread.ts): it opens the keys
// file and the SQLite ledger itself and answers with the page; requests for
// the same view share one render, and more than PAGE_QUEUE different views
// waiting are turned away, never queued without bound.
import assert from 'node:assert/strict';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { test } from 'node:test';
import { FileKeyStore } from '../../src/keys/file-store.ts';
import { createKey } from '../../src/keys/manage.ts';
import { PAGE_QUEUE, PageBusy, pageThread } from '../../src/views/page-thread.ts';
import { SqliteUsageStore, usagePath } from '../../src/ledger/sqlite-store.ts';
import { usageRow } from '../support/rows.ts';

test(
  'the page thread renders from the stores it opens; the same view shares a render; more different views than the queue holds are turned away',
  { timeout: 60_000 },
  async () => {
    const dir = mkdtempSync(join(tmpdir(), 'keyward-page-thread-'));
    const keysFile = join(dir, 'keys.json');
    const thread = pageThread({
      runRoutes: ['scraper'],
      databaseUrl: null,
      databaseTimeoutMs: 5_000,
      keysFile,
      costRoutes: ['seo'],
      routes: ['scraper', 'seo', 'speech'],
      units: { scraper: null, seo: 'usd', speech: 'characters' },
    });
    try {
      const store = new FileKeyStore(keysFile, ['seo']);
      const ada = await createKey(store, 'ada-lovelace');
      const ledger = new SqliteUsageStore(usagePath(keysFile));
      const today = new Date().toISOString().slice(0, 10);
      await ledger.add([usageRow({ keyId: ada.record.id, day: today, requests: 37, cost: 0.5 })], { gateway: 'test', seq: 1 });
      await ledger.close();

      const views = ['key=ada-lovelace', 'route=seo', 'route=speech', 'key=nobody', 'route=scraper', 'key=someone'].map((q) => new URLSearchParams(q));
      const first = thread.page(views[0] as URLSearchParams);
      const again = thread.page(new URLSearchParams('key=ada-lovelace'));
      assert.equal(again, first, 'the same view shares one render');
      const rest = views.slice(1).map((v) =>
        thread.page(v).then(
          (html) => html,
          (err: unknown) => err,
        ),
      );
      const answers = await Promise.all([first, ...rest]);
      const busy = answers.filter((a) => a instanceof PageBusy);
      assert.equal(busy.length, views.length - PAGE_QUEUE, `${PAGE_QUEUE} different views at once, the rest turned away`);
      const html = answers[0];
      assert.match(html, /Usage: key ada-lovelace/);
      assert.match(html, new RegExp(`data-day="${today}" data-route="seo" data-requests="37"`), "the ledger's row, read by the thread");
      assert.match(answers[1] as string, /route seo/);
      // Once those are done, the queue is free again.
      assert.match(await thread.page(new URLSearchParams('route=bogus')), /no route named bogus/);
    } finally {
      await thread.close();
      rmSync(dir, { recursive: true, force: true });
    }
  },
);
