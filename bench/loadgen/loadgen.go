// Package loadgen is the benchmark harness's HTTP/1.1 load generator. Every
// target of one run (a bare upstream, a plain Go reverse proxy, nginx and
// idemproxy) is driven by the same code, so their figures differ only by the
// target.
//
// It speaks HTTP/1.1 over raw keep-alive TCP connections instead of using
// net/http's client: the generator shares two cores with the process it
// measures, and a client that costs as little as possible per request leaves
// the most CPU to the target. Each request's bytes come from a Build function
// that receives a run-wide sequence number, so request bodies can be unique
// per request (new idempotency keys) or drawn from a fixed set (replays).
//
// Two modes:
//   - closed loop (Rate 0): each of Conns connections sends its next request
//     as soon as the previous response is read; latency is send to last byte.
//   - fixed rate (Rate > 0): requests are scheduled at Rate per second spread
//     over Conns connections; latency is counted from the SCHEDULED send time,
//     so a stalled target is charged for the queue it causes (no coordinated
//     omission, as wrk2 does it).
package loadgen

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// Config describes one load phase.
type Config struct {
	// Addr is the target's host:port. Required.
	Addr string
	// Addrs, if set, are several equal targets (replicas without a load
	// balancer): connection i goes to Addrs[i%len(Addrs)], and Addr is only
	// a label.
	Addrs []string
	// Conns is the number of concurrent connections. Zero means 1.
	Conns int
	// Warmup runs before the measured window; its requests are not counted.
	Warmup time.Duration
	// Duration is the measured window. Zero means the phase ends after Total
	// requests instead (Total must then be set).
	Duration time.Duration
	// Total, if positive, ends the phase once Total responses were received
	// (measured from the start, Warmup ignored). Used to pre-populate a store.
	Total int64
	// Rate is the fixed request rate over all connections, per second; zero
	// means closed loop.
	Rate float64
	// Build appends the raw bytes of request number seq (0, 1, 2, ... across
	// the whole phase) to dst and returns the result. Required.
	Build func(dst []byte, seq uint64) []byte
	// FirstSeq is the sequence number of the phase's first request, so that
	// phases of one run can keep request bodies unique.
	FirstSeq uint64
	// Responses, if set, is incremented for every response received, so a
	// caller can follow a long phase's progress.
	Responses *atomic.Int64
	// Window, if set, is called with true when the measured window opens and
	// false when it closes, from the generator's timer goroutine, so the
	// caller can sample the target's CPU and memory at the same instants.
	Window func(open bool)
}

// Result is what one phase measured. Counts and latencies cover the measured
// window only (or the whole phase when Total ends it).
type Result struct {
	OK        int64            // 2xx responses
	Statuses  map[int]int64    // every status received, 2xx included
	Replayed  int64            // responses with Idempotent-Replayed: true
	NetErrors int64            // dial, write, read and parse failures
	Reconnect int64            // connections re-opened (errors or Connection: close)
	Elapsed   time.Duration    // length of the measured window
	Latencies []time.Duration  // of 2xx responses, sorted ascending
	NextSeq   uint64           // first sequence number not used by the phase
	Errors    map[string]int64 // first 100 error texts, counted
}

// RPS returns 2xx responses per second over the measured window.
func (r *Result) RPS() float64 {
	if r.Elapsed <= 0 {
		return 0
	}
	return float64(r.OK) / r.Elapsed.Seconds()
}

// Percentile returns the latency at or below which a fraction q (0..1] of the
// 2xx responses fell (nearest rank on the sorted samples); 0 with no samples.
func (r *Result) Percentile(q float64) time.Duration {
	n := len(r.Latencies)
	if n == 0 {
		return 0
	}
	rank := int(q*float64(n)+0.999999999) - 1
	return r.Latencies[min(max(rank, 0), n-1)]
}

// Failed returns the number of responses that were not 2xx plus network errors.
func (r *Result) Failed() int64 {
	n := r.NetErrors
	for code, c := range r.Statuses {
		if code < 200 || code > 299 {
			n += c
		}
	}
	return n
}

// phase states shared by the workers.
const (
	warming = iota
	measuring
	stopped
)

// run is one phase in progress.
type run struct {
	cfg     Config
	state   atomic.Int32
	seq     atomic.Uint64
	done    atomic.Int64  // responses received (for Total)
	start   time.Time     // phase start (schedule origin for Rate)
	exited  chan struct{} // closed when every worker has returned
	workers []*worker
}

// Run drives cfg's load and returns what it measured. It returns early with
// ctx's error when ctx ends.
func Run(ctx context.Context, cfg Config) (*Result, error) {
	if cfg.Addr == "" || cfg.Build == nil {
		return nil, errors.New("loadgen: Addr and Build are required")
	}
	if cfg.Duration <= 0 && cfg.Total <= 0 {
		return nil, errors.New("loadgen: set Duration or Total")
	}
	cfg.Conns = max(cfg.Conns, 1)
	r := &run{cfg: cfg, start: time.Now(), exited: make(chan struct{})}
	r.seq.Store(cfg.FirstSeq)
	if cfg.Duration <= 0 || cfg.Warmup <= 0 {
		r.state.Store(measuring)
	}
	var wg sync.WaitGroup
	for i := range cfg.Conns {
		w := newWorker(r, i)
		r.workers = append(r.workers, w)
		wg.Go(w.loop)
	}
	go func() { wg.Wait(); close(r.exited) }()
	elapsed, err := r.clock(ctx)
	r.state.Store(stopped)
	for _, w := range r.workers {
		w.interrupt()
	}
	<-r.exited
	res := r.collect()
	res.Elapsed = elapsed
	return res, err
}

// clock opens and closes the measured window and returns its length.
func (r *run) clock(ctx context.Context) (time.Duration, error) {
	if r.cfg.Duration <= 0 {
		return r.untilTotal(ctx)
	}
	if r.state.Load() == warming {
		if err := sleepCtx(ctx, r.cfg.Warmup); err != nil {
			return 0, err
		}
		r.state.Store(measuring)
	}
	open := time.Now()
	r.window(true)
	err := sleepCtx(ctx, r.cfg.Duration)
	r.state.Store(stopped)
	elapsed := time.Since(open)
	r.window(false)
	return elapsed, err
}

// untilTotal waits until Total responses arrived (or every worker gave up
// because the sequence numbers ran out, failures included), polling cheaply.
func (r *run) untilTotal(ctx context.Context) (time.Duration, error) {
	r.window(true)
	defer r.window(false)
	t := time.NewTicker(20 * time.Millisecond)
	defer t.Stop()
	for r.done.Load() < r.cfg.Total {
		select {
		case <-ctx.Done():
			return time.Since(r.start), ctx.Err()
		case <-r.exited:
			return time.Since(r.start), nil
		case <-t.C:
		}
	}
	return time.Since(r.start), nil
}

func (r *run) window(open bool) {
	if r.cfg.Window != nil {
		r.cfg.Window(open)
	}
}

func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// collect merges the workers' counts and sorts the latency samples.
func (r *run) collect() *Result {
	res := &Result{Statuses: map[int]int64{}, Errors: map[string]int64{}, NextSeq: r.seq.Load()}
	n := 0
	for _, w := range r.workers {
		n += len(w.lat)
	}
	res.Latencies = make([]time.Duration, 0, n)
	for _, w := range r.workers {
		res.OK += w.ok
		res.Replayed += w.replayed
		res.NetErrors += w.netErrs
		res.Reconnect += w.reconnects
		for code, c := range w.statuses {
			res.Statuses[code] += c
		}
		for msg, c := range w.errs {
			res.Errors[msg] += c
		}
		res.Latencies = append(res.Latencies, w.lat...)
	}
	slices.Sort(res.Latencies)
	return res
}

// worker owns one connection.
type worker struct {
	r     *run
	id    int
	conn  net.Conn
	br    *bufio.Reader
	buf   []byte
	resp  response
	connM sync.Mutex // guards conn against interrupt

	ok, replayed, netErrs, reconnects int64
	statuses                          map[int]int64
	errs                              map[string]int64
	lat                               []time.Duration
}

func newWorker(r *run, id int) *worker {
	return &worker{r: r, id: id, statuses: map[int]int64{}, errs: map[string]int64{},
		lat: make([]time.Duration, 0, 1<<14)}
}

// interrupt unblocks a worker stuck in a read once the phase has stopped.
func (w *worker) interrupt() {
	w.connM.Lock()
	defer w.connM.Unlock()
	if w.conn != nil {
		w.conn.SetDeadline(time.Now().Add(5 * time.Second))
	}
}

func (w *worker) loop() {
	defer w.closeConn()
	next := w.firstSlot()
	for w.r.state.Load() != stopped {
		seq, ok := w.take()
		if !ok {
			return
		}
		sched := time.Now()
		if w.r.cfg.Rate > 0 {
			sched = next
			next = next.Add(w.interval())
			if d := time.Until(sched); d > 0 {
				time.Sleep(d)
			}
			if w.r.state.Load() == stopped {
				return
			}
		}
		w.one(seq, sched)
	}
}

// take reserves the next sequence number; false once Total is reached.
func (w *worker) take() (uint64, bool) {
	seq := w.r.seq.Add(1) - 1
	if t := w.r.cfg.Total; t > 0 && seq-w.r.cfg.FirstSeq >= uint64(t) {
		return 0, false
	}
	return seq, true
}

// interval is the time between two requests of one connection at Rate.
func (w *worker) interval() time.Duration {
	return time.Duration(float64(w.r.cfg.Conns) / w.r.cfg.Rate * float64(time.Second))
}

// firstSlot staggers the connections' schedules across one interval.
func (w *worker) firstSlot() time.Time {
	if w.r.cfg.Rate <= 0 {
		return time.Time{}
	}
	return w.r.start.Add(w.interval() * time.Duration(w.id) / time.Duration(w.r.cfg.Conns))
}

// one sends request seq and reads its response; sched is when it was due.
func (w *worker) one(seq uint64, sched time.Time) {
	if err := w.ensureConn(); err != nil {
		w.fail(err)
		time.Sleep(10 * time.Millisecond) // do not spin on a dead target
		return
	}
	w.buf = w.r.cfg.Build(w.buf[:0], seq)
	if _, err := w.conn.Write(w.buf); err != nil {
		w.fail(err)
		return
	}
	if err := w.resp.read(w.br); err != nil {
		w.fail(err)
		return
	}
	end := time.Now()
	w.r.done.Add(1)
	if c := w.r.cfg.Responses; c != nil {
		c.Add(1)
	}
	w.record(end.Sub(sched))
	if w.resp.close {
		w.closeConn()
	}
}

// record counts a response if the measured window is open.
func (w *worker) record(lat time.Duration) {
	if w.r.state.Load() != measuring {
		return
	}
	w.statuses[w.resp.status]++
	if w.resp.replayed {
		w.replayed++
	}
	if w.resp.status >= 200 && w.resp.status <= 299 {
		w.ok++
		w.lat = append(w.lat, lat)
	}
}

func (w *worker) fail(err error) {
	w.closeConn()
	if w.r.state.Load() == stopped {
		return // the phase ended under a pending read
	}
	w.netErrs++
	if msg := err.Error(); len(w.errs) < 100 || w.errs[msg] > 0 {
		w.errs[msg]++
	}
}

func (w *worker) ensureConn() error {
	if w.conn != nil {
		return nil
	}
	addr := w.r.cfg.Addr
	if a := w.r.cfg.Addrs; len(a) > 0 {
		addr = a[w.id%len(a)]
	}
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		return fmt.Errorf("dial: %w", err)
	}
	w.connM.Lock()
	w.conn = c
	w.connM.Unlock()
	if w.br == nil {
		w.br = bufio.NewReaderSize(c, 32<<10)
	} else {
		w.br.Reset(c)
	}
	w.reconnects++
	return nil
}

func (w *worker) closeConn() {
	w.connM.Lock()
	defer w.connM.Unlock()
	if w.conn != nil {
		w.conn.Close()
		w.conn = nil
	}
}

// ErrMalformed is wrapped by every response parse failure.
var ErrMalformed = errors.New("loadgen: malformed response")

// response is the part of a response the generator looks at.
type response struct {
	status   int
	replayed bool
	close    bool
}

// read parses one response off br and discards its body (Content-Length or
// chunked; HTTP/1.1 only, which every target speaks).
func (p *response) read(br *bufio.Reader) error {
	*p = response{}
	line, err := br.ReadSlice('\n')
	if err != nil {
		return fmt.Errorf("read status line: %w", err)
	}
	if len(line) < 12 || string(line[:5]) != "HTTP/" {
		return fmt.Errorf("%w: status line %q", ErrMalformed, trimCRLF(line))
	}
	if p.status, err = atoi(line[9:12]); err != nil {
		return err
	}
	length, chunked, err := p.headers(br)
	if err != nil {
		return err
	}
	switch {
	case chunked:
		return discardChunked(br)
	case length >= 0:
		_, err = br.Discard(length)
		return err
	case p.status == 204 || p.status == 304:
		return nil
	}
	return fmt.Errorf("%w: no Content-Length and not chunked", ErrMalformed)
}

// headers reads header lines up to the blank line.
func (p *response) headers(br *bufio.Reader) (length int, chunked bool, err error) {
	length = -1
	for {
		line, err := br.ReadSlice('\n')
		if err != nil {
			return 0, false, fmt.Errorf("read header: %w", err)
		}
		line = trimCRLF(line)
		if len(line) == 0 {
			return length, chunked, nil
		}
		name, value, ok := cutHeader(line)
		if !ok {
			return 0, false, fmt.Errorf("%w: header line %q", ErrMalformed, line)
		}
		switch {
		case equalFold(name, "content-length"):
			if length, err = atoi(value); err != nil {
				return 0, false, err
			}
		case equalFold(name, "transfer-encoding"):
			chunked = equalFold(value, "chunked")
		case equalFold(name, "connection"):
			p.close = equalFold(value, "close")
		case equalFold(name, "idempotent-replayed"):
			p.replayed = equalFold(value, "true")
		}
	}
}

// discardChunked reads a chunked body and its (empty) trailer.
func discardChunked(br *bufio.Reader) error {
	for {
		line, err := br.ReadSlice('\n')
		if err != nil {
			return fmt.Errorf("read chunk size: %w", err)
		}
		n, err := hexSize(trimCRLF(line))
		if err != nil {
			return err
		}
		if n == 0 {
			return skipTrailer(br)
		}
		if _, err := br.Discard(n + 2); err != nil {
			return fmt.Errorf("read chunk: %w", err)
		}
	}
}

func skipTrailer(br *bufio.Reader) error {
	for {
		line, err := br.ReadSlice('\n')
		if err != nil {
			return fmt.Errorf("read trailer: %w", err)
		}
		if len(trimCRLF(line)) == 0 {
			return nil
		}
	}
}

func trimCRLF(b []byte) []byte {
	for len(b) > 0 && (b[len(b)-1] == '\n' || b[len(b)-1] == '\r') {
		b = b[:len(b)-1]
	}
	return b
}

func cutHeader(line []byte) (name, value []byte, ok bool) {
	for i, c := range line {
		if c == ':' {
			v := line[i+1:]
			for len(v) > 0 && (v[0] == ' ' || v[0] == '\t') {
				v = v[1:]
			}
			for len(v) > 0 && (v[len(v)-1] == ' ' || v[len(v)-1] == '\t') {
				v = v[:len(v)-1]
			}
			return line[:i], v, true
		}
	}
	return nil, nil, false
}

// equalFold compares ASCII case-insensitively without allocating.
func equalFold(b []byte, s string) bool {
	if len(b) != len(s) {
		return false
	}
	for i := range b {
		c := b[i]
		if 'A' <= c && c <= 'Z' {
			c += 'a' - 'A'
		}
		if c != s[i] {
			return false
		}
	}
	return true
}

func atoi(b []byte) (int, error) {
	if len(b) == 0 || len(b) > 12 {
		return 0, fmt.Errorf("%w: number %q", ErrMalformed, b)
	}
	n := 0
	for _, c := range b {
		if c < '0' || c > '9' {
			return 0, fmt.Errorf("%w: number %q", ErrMalformed, b)
		}
		n = n*10 + int(c-'0')
	}
	return n, nil
}

func hexSize(b []byte) (int, error) {
	for i, c := range b {
		if c == ';' { // chunk extension
			b = b[:i]
			break
		}
	}
	if len(b) == 0 || len(b) > 8 {
		return 0, fmt.Errorf("%w: chunk size %q", ErrMalformed, b)
	}
	n := 0
	for _, c := range b {
		var d byte
		switch {
		case '0' <= c && c <= '9':
			d = c - '0'
		case 'a' <= c && c <= 'f':
			d = c - 'a' + 10
		case 'A' <= c && c <= 'F':
			d = c - 'A' + 10
		default:
			return 0, fmt.Errorf("%w: chunk size %q", ErrMalformed, b)
		}
		n = n<<4 | int(d)
	}
	return n, nil
}
