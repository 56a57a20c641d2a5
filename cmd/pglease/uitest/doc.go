// Package uitest drives `pglease ui` in a real browser: Debian's chromium,
// headless, through chromedp. It is a module of its own so that the
// library's go.mod does not depend on chromedp. The tests build the pglease
// command, start it against PostgreSQL (PGLEASE_TEST_DSN) and click
// through the console as an operator would. The browser is PGLEASE_CHROMIUM,
// else chromium on PATH (scripts/install-deps.sh chromium installs Debian's;
// `make test` runs it when it is missing); set PGLEASE_UI_SCREENSHOTS to a
// directory to write the screenshots of docs/operations.md there.
package uitest
