package sandbox

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net/http"
	"time"

	"golang.org/x/time/rate"
)

// Provider names accepted in Config.Provider.
const (
	ProviderCards    = "cards"
	ProviderPayments = "payments"
	ProviderPayouts  = "payouts"
)

// Defaults applied by New to zero Config fields.
const (
	// DefaultSlowDelay is longer than idemproxy's default attempt timeout
	// (IDEMPROXY_ATTEMPT_TIMEOUT=30s), so a slow answer is a timeout for it.
	DefaultSlowDelay = 35 * time.Second
	// DefaultRetryAfter is what the payouts provider sends: "Retry-After: 60".
	DefaultRetryAfter = 60
	// maxBodyBytes caps request bodies; the sandbox is not a load target.
	maxBodyBytes = 1 << 20
)

// Config selects a provider's behaviour and the faults to inject. The zero
// value of every field but Provider means something; see each field.
type Config struct {
	// Provider is "cards", "payments" or "payouts"; required.
	Provider string

	// Secret is the HMAC-SHA256 key requests are signed with. Empty means
	// signatures, timestamps and nonces are not checked at all.
	//
	// payments canonical string (IDEMPROXY_SIGN_CANONICAL must be
	// PaymentsCanonical, IDEMPROXY_NONCE_HEADER=X-Nonce):
	//	METHOD\npath\ntimestamp\nnonce\nidempotency_key\nhex(sha256(body))
	// payouts and cards canonical string (TimestampCanonical, idemproxy's
	// default): timestamp\nMETHOD\npath\nbody
	Secret []byte

	// PublicID is the X-Public-Id a payouts request must carry. Empty means
	// the header is not checked. Other providers ignore it.
	PublicID string

	// Faults are the per-request fault probabilities; zero means none.
	Faults Faults

	// SlowDelay is how long SlowAfterProcessing holds a response. Zero means
	// DefaultSlowDelay. The wait ends early if the client goes away.
	SlowDelay time.Duration

	// RateLimit is the provider's own limit in requests per second, over all
	// provider routes; above it the answer is 429 with Retry-After. Zero
	// means no limit.
	RateLimit float64

	// RateBurst is the limiter's bucket size. Zero means 1.
	RateBurst int

	// RetryAfter is the Retry-After value, in seconds, of every 429 (own
	// limit and RateLimited fault). Zero means DefaultRetryAfter.
	RetryAfter int

	// MaturingAttempts (payouts) is how many attempts of a new order are
	// refused with 409 payout.funds_maturing or payout.frozen (chosen per
	// order) before it can succeed. Zero means never.
	MaturingAttempts int

	// MaturingShare (payouts) is the probability that a new order is one of
	// the maturing ones. Zero means every order (when MaturingAttempts > 0).
	MaturingShare float64

	// KeyRetention (payments) is how long an Idempotency-Key is remembered
	// (the provider promises at least 48 hours). A request with a key older than this
	// is a new operation: a blind resend after it executes again. Zero means
	// forever.
	KeyRetention time.Duration

	// Balance (payouts) is the largest amount a payout may have; above it the
	// answer is 409 payout.insufficient_funds, a final refusal. The balance is
	// a threshold and is not spent.
	//
	// Balance (cards) is the account's funds: every card issue and top-up
	// reserves its hold_amount from it, and one that does not fit answers 409
	// balance_exhausted (no reserve was created: nothing is reserved or
	// recorded under the key). Closing a card does not give funds back.
	//
	// Zero means no limit.
	Balance float64

	// Seed seeds the random generator behind faults, maturing orders and
	// ids. The same seed and the same sequence of requests give the same run.
	Seed int64

	// Now is the clock for timestamps, created_at and the rate limiter. Nil
	// means time.Now.
	Now func() time.Time

	// ExecuteHook, when set, is called on the request's goroutine while an
	// operation executes: after its key and order are marked in flight and
	// before it is created and recorded. Blocking in it holds the execution,
	// which is how tests observe idempotency.in_progress without sleeping.
	// It may be called for an operation that is then refused by a state
	// check (card_not_active). Nil means none.
	ExecuteHook func(Operation)

	// Logger receives one line per injected fault or throttled request. Nil
	// means nothing is logged. Secrets and signatures are never logged.
	Logger *slog.Logger
}

// Faults are independent per-request probabilities, each in [0, 1].
type Faults struct {
	// DropBeforeProcessing closes the connection without executing.
	DropBeforeProcessing float64
	// DropAfterProcessing executes and records the operation, then closes
	// the connection: the response is lost.
	DropAfterProcessing float64
	// SlowAfterProcessing executes, then holds the response for SlowDelay.
	SlowAfterProcessing float64
	// GatewayTimeoutAfterProcessing executes, then answers 504
	// gateway_timeout instead of the result (payments: with the payment_id).
	GatewayTimeoutAfterProcessing float64
	// Status5xx answers 500, 502, 503 or 504 without executing.
	Status5xx float64
	// RateLimited answers 429 with Retry-After without executing.
	RateLimited float64
	// Maintenance answers 503 maintenance without executing ("money did not
	// move", as the cards provider says).
	Maintenance float64
}

// Server is the sandbox; it implements http.Handler and is safe for
// concurrent use. It holds no goroutines or files, so it needs no Close.
type Server struct {
	*core
	provider   string
	api        provider
	limiter    *rate.Limiter
	faults     Faults
	slowDelay  time.Duration
	retryAfter int
	log        *slog.Logger
	mux        *http.ServeMux
}

// provider is one provider's routes, credentials check and 429 shape.
type provider interface {
	// register adds the provider's routes to mux, each through wrap.
	register(mux *http.ServeMux, wrap func(handler) http.Handler)
	// authenticate returns a refusal and false when credentials are wrong.
	authenticate(c *call) (reply, bool)
	// throttled is the provider's 429 answer.
	throttled(retryAfter int) reply
}

// handler answers one provider request.
type handler func(c *call) reply

// call is one provider request with its body already read.
type call struct {
	r    *http.Request
	body []byte
	key  string // Idempotency-Key header; empty when absent
}

// New validates cfg and returns a Server for cfg.Provider.
func New(cfg Config) (*Server, error) {
	if err := validate(cfg); err != nil {
		return nil, fmt.Errorf("sandbox: %w", err)
	}
	c := newCore(cfg)
	s := &Server{
		core:       c,
		provider:   cfg.Provider,
		api:        newProvider(c, cfg),
		faults:     cfg.Faults,
		slowDelay:  orDefault(cfg.SlowDelay, DefaultSlowDelay),
		retryAfter: orDefault(cfg.RetryAfter, DefaultRetryAfter),
		log:        cfg.Logger,
		mux:        http.NewServeMux(),
	}
	if s.log == nil {
		s.log = slog.New(slog.DiscardHandler)
	}
	if cfg.RateLimit > 0 {
		s.limiter = rate.NewLimiter(rate.Limit(cfg.RateLimit), orDefault(cfg.RateBurst, 1))
	}
	s.api.register(s.mux, s.wrap)
	s.mux.HandleFunc("GET /_sandbox/ledger", s.serveLedger)
	s.mux.HandleFunc("/", func(w http.ResponseWriter, _ *http.Request) {
		errorReply(http.StatusNotFound, "not_found", "no such endpoint for provider "+cfg.Provider).write(w)
	})
	return s, nil
}

// newProvider builds the provider validate accepted.
func newProvider(c *core, cfg Config) provider {
	switch cfg.Provider {
	case ProviderCards:
		return newCards(c, cfg.Secret, cfg.Balance)
	case ProviderPayments:
		return newPayments(c, cfg.Secret, cfg.KeyRetention)
	default:
		return newPayouts(c, cfg)
	}
}

// validate rejects settings New cannot honour, naming the field.
func validate(cfg Config) error {
	switch cfg.Provider {
	case ProviderCards, ProviderPayments, ProviderPayouts:
	default:
		return fmt.Errorf("Provider %q: want cards, payments or payouts", cfg.Provider)
	}
	probabilities := map[string]float64{
		"Faults.DropBeforeProcessing":          cfg.Faults.DropBeforeProcessing,
		"Faults.DropAfterProcessing":           cfg.Faults.DropAfterProcessing,
		"Faults.SlowAfterProcessing":           cfg.Faults.SlowAfterProcessing,
		"Faults.GatewayTimeoutAfterProcessing": cfg.Faults.GatewayTimeoutAfterProcessing,
		"Faults.Status5xx":                     cfg.Faults.Status5xx,
		"Faults.RateLimited":                   cfg.Faults.RateLimited,
		"Faults.Maintenance":                   cfg.Faults.Maintenance,
		"MaturingShare":                        cfg.MaturingShare,
	}
	for name, p := range probabilities {
		if math.IsNaN(p) || p < 0 || p > 1 {
			return fmt.Errorf("%s %v: want a probability in [0, 1]", name, p)
		}
	}
	if cfg.SlowDelay < 0 || cfg.KeyRetention < 0 || cfg.RateLimit < 0 || cfg.RateBurst < 0 || cfg.RetryAfter < 0 ||
		cfg.MaturingAttempts < 0 || cfg.Balance < 0 {
		return errors.New("SlowDelay, KeyRetention, RateLimit, RateBurst, RetryAfter, MaturingAttempts and Balance must not be negative")
	}
	return nil
}

// orDefault returns v, or def when v is zero.
func orDefault[T comparable](v, def T) T {
	var zero T
	if v == zero {
		return def
	}
	return v
}

// ServeHTTP serves the provider's routes and /_sandbox/ledger.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	s.mux.ServeHTTP(w, r)
}

// Ledger returns a snapshot of the ledger, entries included.
func (s *Server) Ledger() LedgerSnapshot {
	return s.ledger.snapshot(s.provider, true)
}

// serveLedger answers GET /_sandbox/ledger[?full=1].
func (s *Server) serveLedger(w http.ResponseWriter, r *http.Request) {
	full := r.URL.Query().Get("full")
	snap := s.ledger.snapshot(s.provider, full == "1" || full == "true")
	body, err := json.MarshalIndent(snap, "", "  ") // read by people with curl, too
	if err != nil {
		errorReply(http.StatusInternalServerError, "internal_error", "encode ledger").write(w)
		return
	}
	reply{status: http.StatusOK, body: append(body, '\n')}.write(w)
}

// wrap puts a provider handler behind the request pipeline: own rate limit,
// faults before processing, authentication, the handler, faults after it.
func (s *Server) wrap(h handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxBodyBytes))
		if err != nil {
			errorReply(http.StatusRequestEntityTooLarge, "body_too_large", "request body too large or unreadable").write(w)
			return
		}
		if s.limiter != nil && !s.limiter.AllowN(s.now(), 1) {
			s.ledger.throttle()
			s.log.Info("sandbox: own rate limit", "method", r.Method, "path", r.URL.Path)
			s.api.throttled(s.retryAfter).write(w)
			return
		}
		p := s.plan()
		if p.before != "" {
			s.injectBefore(w, r, p.before)
			return
		}
		c := &call{r: r, body: body, key: r.Header.Get("Idempotency-Key")}
		rep, ok := s.api.authenticate(c)
		if ok {
			rep = h(c)
		}
		if rep.done != nil {
			defer rep.done()
		}
		s.deliver(w, r, rep, p.after)
	})
}
