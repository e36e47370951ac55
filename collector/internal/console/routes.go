package console

import (
	"embed"
	"errors"
	"html/template"
	"io/fs"
	"net/http"
	"net/url"
	"strings"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	trainmeterv1 "github.com/trainmeter/trainmeter/proto/trainmeter/v1"
)

//go:embed templates/*.html
var templateFS embed.FS

//go:embed static
var staticFS embed.FS

// CSP allows the console's own scripts and styles only: no inline script or
// handler, no eval, no plugin, no framing, forms and fetches to itself.
// uPlot styles its elements through the CSSOM (el.style), which style-src
// does not restrict.
const CSP = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; " +
	"font-src 'self'; form-action 'self'; base-uri 'none'; frame-ancestors 'none'; object-src 'none'"

// tokenCookie holds the query token a browser logged in with.
const tokenCookie = "trainmeter_token"

// authMethod is the RPC whose role the console's pages need: they only
// read, so the read role, as every read RPC the pages call.
var authMethod = trainmeterv1.QueryService_ListRuns_FullMethodName

func (c *Console) routes() (http.Handler, error) {
	tpl, err := parseTemplates()
	if err != nil {
		return nil, err
	}
	static, err := fs.Sub(staticFS, "static")
	if err != nil {
		return nil, err
	}
	p := &pages{c: c, tpl: tpl}
	mux := http.NewServeMux()
	mux.Handle("GET /static/", http.StripPrefix("/static/", immutable(http.FileServerFS(static))))
	mux.HandleFunc("GET /login", p.login)
	mux.HandleFunc("POST /login", p.loginPost)
	mux.HandleFunc("POST /logout", p.logout)
	data := http.NewServeMux()
	data.HandleFunc("GET /{$}", p.home)
	data.HandleFunc("GET /runs", p.runs)
	data.HandleFunc("GET /runs/rows", p.runsRows)
	data.HandleFunc("GET /runs/{id}", p.run)
	data.HandleFunc("GET /runs/{id}/summary", p.runSummary)
	data.HandleFunc("GET /api/runs/{id}/timeline", p.timeline)
	data.HandleFunc("GET /usage", p.usage)
	data.HandleFunc("GET /usage.csv", p.usageCSV)
	data.HandleFunc("GET /compare", p.compare)
	data.HandleFunc("GET /budgets", p.budgets)
	data.HandleFunc("GET /prices", p.prices)
	data.HandleFunc("GET /recommendations", p.recommendations)
	data.HandleFunc("GET /nodes", p.nodes)
	mux.Handle("/", c.authorized(data))
	return headers(c.cfg.TLS.Enabled(), mux), nil
}

func parseTemplates() (*template.Template, error) {
	return template.New("").Funcs(funcs).ParseFS(templateFS, "templates/*.html")
}

// headers sets the security headers on every answer. Referrer-Policy is
// same-origin, not no-referrer: under no-referrer a browser sends
// "Origin: null" with the console's own login form, and the login's
// cross-site check (sameOrigin) needs the real origin; nothing goes to
// another site either way.
func headers(hsts bool, h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hd := w.Header()
		hd.Set("Content-Security-Policy", CSP)
		hd.Set("X-Content-Type-Options", "nosniff")
		hd.Set("X-Frame-Options", "DENY")
		hd.Set("Referrer-Policy", "same-origin")
		hd.Set("Cross-Origin-Opener-Policy", "same-origin")
		hd.Set("Cross-Origin-Resource-Policy", "same-origin")
		hd.Set("Permissions-Policy", "camera=(), microphone=(), geolocation=()")
		if hsts {
			hd.Set("Strict-Transport-Security", "max-age=31536000")
		}
		h.ServeHTTP(w, r)
	})
}

// immutable: the embedded assets change only with the binary; the version
// query string in the pages' links changes with them.
func immutable(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Cache-Control", "public, max-age=86400")
		h.ServeHTTP(w, r)
	})
}

// requestToken is the token of a request: an Authorization: Bearer header
// (scripts, curl) or the login cookie (browsers).
func requestToken(r *http.Request) string {
	if v := r.Header.Get("Authorization"); len(v) > 7 && strings.EqualFold(v[:7], "bearer ") {
		return strings.TrimSpace(v[7:])
	}
	if ck, err := r.Cookie(tokenCookie); err == nil {
		return ck.Value
	}
	return ""
}

// authorized lets a request through when its token passes the query API's
// rules for a read RPC; a page without one is sent to the login form, data
// and fragments answer 401.
func (c *Console) authorized(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Cache-Control", "no-store")
		if c.cfg.Auth == nil || !c.cfg.Auth.QueryTokens() {
			h.ServeHTTP(w, r)
			return
		}
		err := c.cfg.Auth.Authorize(r.Context(), authMethod, requestToken(r))
		if err == nil {
			h.ServeHTTP(w, r)
			return
		}
		if isPage(r) {
			http.Redirect(w, r, "/login?next="+url.QueryEscape(r.URL.RequestURI()), http.StatusSeeOther)
			return
		}
		w.Header().Set("WWW-Authenticate", `Bearer realm="trainmeter"`)
		http.Error(w, status.Convert(err).Message(), http.StatusUnauthorized)
	})
}

// isPage: a browser navigation (not a script's fetch of data or a fragment).
func isPage(r *http.Request) bool {
	p := r.URL.Path
	return !strings.HasPrefix(p, "/api/") && !strings.HasSuffix(p, "/rows") && !strings.HasSuffix(p, "/summary") &&
		r.Header.Get("Authorization") == ""
}

// httpStatus maps a service error to an HTTP status and a message for the
// page: bad input is the user's to fix (400/404), anything else is ours.
func httpStatus(err error) (int, string) {
	st := status.Convert(err)
	switch st.Code() {
	case codes.InvalidArgument, codes.FailedPrecondition:
		return http.StatusBadRequest, st.Message()
	case codes.NotFound:
		return http.StatusNotFound, st.Message()
	case codes.Unauthenticated, codes.PermissionDenied:
		return http.StatusForbidden, st.Message()
	}
	if errors.Is(err, errBadRequest) {
		return http.StatusBadRequest, err.Error()
	}
	return http.StatusInternalServerError, st.Message()
}

var errBadRequest = errors.New("bad request")
