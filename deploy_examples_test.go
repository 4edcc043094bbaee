// The Kubernetes example, deploy/kubernetes.yaml: no cluster runs it here,
// so these tests decode it strictly and check what the README says of it and
// what idemproxy needs from it. The compose examples are run by imagetest;
// only their variables are checked here.

package main

import (
	"bytes"
	"errors"
	"io"
	"os"
	"path"
	"reflect"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"
)

// configDefaults are config's variables, by full name, with their defaults
// ("" when none).
func configDefaults(t *testing.T) map[string]string {
	vars := map[string]string{}
	for _, f := range configFields(t) {
		vars[f.name] = f.tag.Get("envDefault")
	}
	return vars
}

// The manifest's objects, with the fields the example uses. Decoding refuses
// any other key, so a misspelt one (readinesProbe, say), which Kubernetes
// would drop or refuse, fails here.

type object struct {
	APIVersion string    `yaml:"apiVersion"`
	Kind       string    `yaml:"kind"`
	Metadata   metadata  `yaml:"metadata"`
	Spec       yaml.Node `yaml:"spec"`
}

type metadata struct {
	Name   string            `yaml:"name"`
	Labels map[string]string `yaml:"labels"`
}

type selector struct {
	MatchLabels map[string]string `yaml:"matchLabels"`
}

type deploymentSpec struct {
	Replicas *int `yaml:"replicas"`
	Strategy struct {
		Type          string `yaml:"type"`
		RollingUpdate struct {
			MaxUnavailable *string `yaml:"maxUnavailable"`
			MaxSurge       *string `yaml:"maxSurge"`
		} `yaml:"rollingUpdate"`
	} `yaml:"strategy"`
	Selector selector `yaml:"selector"`
	Template struct {
		Metadata metadata `yaml:"metadata"`
		Spec     podSpec  `yaml:"spec"`
	} `yaml:"template"`
}

type podSpec struct {
	TerminationGracePeriodSeconds *int `yaml:"terminationGracePeriodSeconds"`
	SecurityContext               struct {
		RunAsNonRoot   *bool  `yaml:"runAsNonRoot"`
		RunAsUser      *int64 `yaml:"runAsUser"`
		RunAsGroup     *int64 `yaml:"runAsGroup"`
		SeccompProfile struct {
			Type string `yaml:"type"`
		} `yaml:"seccompProfile"`
	} `yaml:"securityContext"`
	Containers []container `yaml:"containers"`
	Volumes    []struct {
		Name   string `yaml:"name"`
		Secret *struct {
			SecretName string `yaml:"secretName"`
		} `yaml:"secret"`
	} `yaml:"volumes"`
}

type container struct {
	Name  string `yaml:"name"`
	Image string `yaml:"image"`
	Ports []struct {
		Name          string `yaml:"name"`
		ContainerPort int    `yaml:"containerPort"`
	} `yaml:"ports"`
	Env []struct {
		Name      string `yaml:"name"`
		Value     string `yaml:"value"`
		ValueFrom *struct {
			SecretKeyRef *struct {
				Name string `yaml:"name"`
				Key  string `yaml:"key"`
			} `yaml:"secretKeyRef"`
		} `yaml:"valueFrom"`
	} `yaml:"env"`
	VolumeMounts []struct {
		Name      string `yaml:"name"`
		MountPath string `yaml:"mountPath"`
		ReadOnly  bool   `yaml:"readOnly"`
	} `yaml:"volumeMounts"`
	ReadinessProbe *httpProbe `yaml:"readinessProbe"`
	LivenessProbe  *httpProbe `yaml:"livenessProbe"`
	Lifecycle      struct {
		PreStop *struct {
			Sleep *struct {
				Seconds int `yaml:"seconds"`
			} `yaml:"sleep"`
		} `yaml:"preStop"`
	} `yaml:"lifecycle"`
	Resources struct {
		Requests map[string]string `yaml:"requests"`
		Limits   map[string]string `yaml:"limits"`
	} `yaml:"resources"`
	SecurityContext struct {
		ReadOnlyRootFilesystem   *bool `yaml:"readOnlyRootFilesystem"`
		AllowPrivilegeEscalation *bool `yaml:"allowPrivilegeEscalation"`
		Capabilities             struct {
			Drop []string `yaml:"drop"`
		} `yaml:"capabilities"`
	} `yaml:"securityContext"`
}

type httpProbe struct {
	HTTPGet *struct {
		Path string `yaml:"path"`
		Port string `yaml:"port"` // a number or a port's name
	} `yaml:"httpGet"`
	PeriodSeconds    int `yaml:"periodSeconds"`
	TimeoutSeconds   int `yaml:"timeoutSeconds"`
	FailureThreshold int `yaml:"failureThreshold"`
}

type pdbSpec struct {
	MinAvailable   *string  `yaml:"minAvailable"`
	MaxUnavailable *string  `yaml:"maxUnavailable"`
	Selector       selector `yaml:"selector"`
}

type serviceSpec struct {
	Selector map[string]string `yaml:"selector"`
	Ports    []struct {
		Name       string `yaml:"name"`
		Port       int    `yaml:"port"`
		TargetPort string `yaml:"targetPort"`
	} `yaml:"ports"`
}

// strict decodes node into out, refusing keys out has no field for.
func strict(t *testing.T, what string, node *yaml.Node, out any) {
	t.Helper()
	var buf bytes.Buffer
	if err := yaml.NewEncoder(&buf).Encode(node); err != nil {
		t.Fatal(err)
	}
	dec := yaml.NewDecoder(&buf)
	dec.KnownFields(true)
	if err := dec.Decode(out); err != nil {
		t.Fatalf("%s: %v", what, err)
	}
}

// manifest is deploy/kubernetes.yaml, one object of each kind it has.
type manifest struct {
	deployment deploymentSpec
	pdb        pdbSpec
	service    serviceSpec
	name       map[string]string // kind -> metadata.name
}

func readManifest(t *testing.T) manifest {
	t.Helper()
	raw, err := os.ReadFile("deploy/kubernetes.yaml")
	if err != nil {
		t.Fatal(err)
	}
	m := manifest{name: map[string]string{}}
	dec := yaml.NewDecoder(bytes.NewReader(raw))
	dec.KnownFields(true)
	for {
		var o object
		err := dec.Decode(&o)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("kubernetes.yaml: %v", err)
		}
		if _, dup := m.name[o.Kind]; dup {
			t.Fatalf("kubernetes.yaml has two %s objects; the test expects one", o.Kind)
		}
		m.name[o.Kind] = o.Metadata.Name
		want := map[string]string{"Deployment": "apps/v1", "PodDisruptionBudget": "policy/v1", "Service": "v1"}[o.Kind]
		if want == "" {
			t.Fatalf("kubernetes.yaml: a %s; the test knows Deployment, PodDisruptionBudget and Service", o.Kind)
		}
		if o.APIVersion != want {
			t.Errorf("%s: apiVersion %q, want %q (served by current Kubernetes)", o.Kind, o.APIVersion, want)
		}
		switch o.Kind {
		case "Deployment":
			strict(t, "Deployment spec", &o.Spec, &m.deployment)
		case "PodDisruptionBudget":
			strict(t, "PodDisruptionBudget spec", &o.Spec, &m.pdb)
		case "Service":
			strict(t, "Service spec", &o.Spec, &m.service)
		}
	}
	for _, kind := range []string{"Deployment", "PodDisruptionBudget", "Service"} {
		if m.name[kind] == "" {
			t.Fatalf("kubernetes.yaml has no named %s", kind)
		}
	}
	return m
}

// port is the port of a listen address such as ":8080" or "0.0.0.0:9090".
func port(t *testing.T, addr string) int {
	t.Helper()
	i := strings.LastIndex(addr, ":")
	p, err := strconv.Atoi(addr[i+1:])
	if i < 0 || err != nil {
		t.Fatalf("listen address %q has no port", addr)
	}
	return p
}

// mebibytes reads a Kubernetes memory quantity written in Mi or Gi.
func mebibytes(t *testing.T, q string) int {
	t.Helper()
	for suffix, mul := range map[string]int{"Mi": 1, "Gi": 1024} {
		if n, ok := strings.CutSuffix(q, suffix); ok {
			v, err := strconv.Atoi(n)
			if err == nil {
				return v * mul
			}
		}
	}
	t.Fatalf("memory quantity %q: the test reads only whole Mi or Gi", q)
	return 0
}

// deref is *s, or "unset".
func deref(s *string) string {
	if s == nil {
		return "unset"
	}
	return *s
}

// subset reports whether every label of sel is in labels.
func subset(sel, labels map[string]string) bool {
	for k, v := range sel {
		if labels[k] != v {
			return false
		}
	}
	return len(sel) > 0
}

// readmeExamples is the README's paragraph on the deployment examples.
func readmeExamples(t *testing.T) string {
	t.Helper()
	raw, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range strings.Split(string(raw), "\n\n") {
		if strings.HasPrefix(p, "Examples: `deploy/kubernetes.yaml`") {
			return strings.Join(strings.Fields(p), " ")
		}
	}
	t.Fatal("the README has no paragraph starting \"Examples: `deploy/kubernetes.yaml`\"")
	return ""
}

// The Kubernetes example, decoded strictly, against what the README says of
// it and what idemproxy needs: replicas on PostgreSQL behind readiness,
// updated and drained without losing capacity or a running operation, with
// its secrets from a Secret, locked down.
func TestKubernetesExample(t *testing.T) {
	vars := configDefaults(t)
	m := readManifest(t)
	d := m.deployment
	pod := d.Template.Spec

	// What the README says of it.
	readme := readmeExamples(t)
	replicas := 1
	if d.Replicas != nil {
		replicas = *d.Replicas
	}
	var minAvailable int
	if m.pdb.MinAvailable == nil || m.pdb.MaxUnavailable != nil {
		t.Fatal("PodDisruptionBudget: want minAvailable (as the README says: the number kept available) and no maxUnavailable")
	} else if n, err := strconv.Atoi(*m.pdb.MinAvailable); err != nil {
		t.Fatalf("PodDisruptionBudget: minAvailable %q, want a number of pods", *m.pdb.MinAvailable)
	} else {
		minAvailable = n
	}
	for _, claim := range []string{
		"a Deployment with " + strconv.Itoa(replicas) + " replicas",
		"`RollingUpdate` with `maxUnavailable: 0`",
		"readiness on `/readyz`",
		"a PodDisruptionBudget keeping " + strconv.Itoa(minAvailable) + " available",
		"the admin token from a Secret",
	} {
		if !strings.Contains(readme, claim) {
			t.Errorf("the README's paragraph on the examples does not say %q, which is what kubernetes.yaml has:\n%s", claim, readme)
		}
	}

	// Several replicas, replaced one at a time with none removed before its
	// successor is ready.
	if replicas < 2 {
		t.Errorf("replicas %d, want at least 2", replicas)
	}
	if d.Strategy.Type != "RollingUpdate" {
		t.Errorf("strategy %q, want RollingUpdate", d.Strategy.Type)
	}
	if mu := d.Strategy.RollingUpdate.MaxUnavailable; mu == nil || (*mu != "0" && *mu != "0%") {
		t.Errorf("rollingUpdate.maxUnavailable %s, want 0 (the default is 25%%)", deref(mu))
	}
	if ms := d.Strategy.RollingUpdate.MaxSurge; ms != nil && (*ms == "0" || *ms == "0%") {
		t.Error("rollingUpdate.maxSurge 0 with maxUnavailable 0: the rollout could never start")
	}
	if !subset(d.Selector.MatchLabels, d.Template.Metadata.Labels) {
		t.Errorf("the Deployment's selector %v does not select its pods %v", d.Selector.MatchLabels, d.Template.Metadata.Labels)
	}

	// A voluntary disruption (a node drain) keeps minAvailable pods, and can
	// still evict one: minAvailable equal to replicas would block drains.
	if minAvailable < 1 || minAvailable >= replicas {
		t.Errorf("PodDisruptionBudget minAvailable %d with %d replicas: want at least 1 and fewer than the replicas", minAvailable, replicas)
	}
	if !reflect.DeepEqual(m.pdb.Selector.MatchLabels, d.Selector.MatchLabels) {
		t.Errorf("the PodDisruptionBudget selects %v, the Deployment %v", m.pdb.Selector.MatchLabels, d.Selector.MatchLabels)
	}

	if len(pod.Containers) != 1 {
		t.Fatalf("%d containers, want idemproxy alone", len(pod.Containers))
	}
	c := pod.Containers[0]

	// The environment: only idemproxy's own variables, each once, the
	// upstream set, the store shared, every secret from the Secret.
	env := map[string]string{}
	for _, e := range c.Env {
		if !strings.HasPrefix(e.Name, "IDEMPROXY_") {
			continue
		}
		if _, ok := vars[e.Name]; !ok {
			t.Errorf("env %s is not one of idemproxy's variables (config.go)", e.Name)
		}
		if _, dup := env[e.Name]; dup {
			t.Errorf("env %s is set twice", e.Name)
		}
		if e.ValueFrom != nil {
			if e.ValueFrom.SecretKeyRef == nil || e.Value != "" {
				t.Errorf("env %s: want a value or a secretKeyRef", e.Name)
			}
			env[e.Name] = "(secret)"
			continue
		}
		env[e.Name] = e.Value
	}
	for name := range env {
		if _, both := env[name+"_FILE"]; both {
			t.Errorf("env sets both %s and %s_FILE; idemproxy refuses that at start", name, name)
		}
	}
	if env["IDEMPROXY_UPSTREAM_URL"] == "" || !strings.HasPrefix(env["IDEMPROXY_UPSTREAM_URL"], "https://") {
		t.Errorf("IDEMPROXY_UPSTREAM_URL %q, want the provider's https URL", env["IDEMPROXY_UPSTREAM_URL"])
	}
	secretDirs := map[string]bool{} // mount paths of Secret volumes
	for _, vm := range c.VolumeMounts {
		for _, v := range pod.Volumes {
			if v.Name == vm.Name && v.Secret != nil {
				if !vm.ReadOnly {
					t.Errorf("the Secret volume %s is mounted writable", vm.Name)
				}
				secretDirs[vm.MountPath] = true
			}
		}
	}
	for _, name := range []string{"IDEMPROXY_STORE_URL", "IDEMPROXY_SIGN_SECRET", "IDEMPROXY_ADMIN_TOKEN"} {
		switch {
		case env[name] == "(secret)":
		case env[name+"_FILE"] != "":
			if !secretDirs[path.Dir(env[name+"_FILE"])] {
				t.Errorf("%s_FILE %s is not in a mounted Secret volume (mounted: %v)", name, env[name+"_FILE"], secretDirs)
			}
		case env[name] != "":
			t.Errorf("%s is written in the manifest; it holds a secret, so take it from the Secret", name)
		default:
			switch name {
			case "IDEMPROXY_STORE_URL":
				t.Error("no IDEMPROXY_STORE_URL(_FILE): replicas without the shared store each have their own records, and one operation can run twice")
			case "IDEMPROXY_ADMIN_TOKEN":
				// Any pod in the cluster reaches the admin port (the
				// probes need it open to the kubelet): without a token,
				// anyone there resolves, renews or discards records.
				t.Error("no IDEMPROXY_ADMIN_TOKEN(_FILE): the admin API would be open to every pod in the cluster")
			}
		}
	}
	if _, ok := env["IDEMPROXY_DATA_DIR"]; ok {
		t.Error("IDEMPROXY_DATA_DIR is set, but replicas on PostgreSQL do not use it")
	}

	// Ports: the app's listen port and the admin port, where the probes go.
	setting := func(name string) string {
		if v, ok := env[name]; ok {
			return v
		}
		return vars[name]
	}
	ports := map[string]int{}
	for _, p := range c.Ports {
		ports[p.Name] = p.ContainerPort
	}
	listen, admin := port(t, setting("IDEMPROXY_LISTEN_ADDR")), port(t, setting("IDEMPROXY_ADMIN_ADDR"))
	if len(ports) != 2 || ports["proxy"] != listen || ports["admin"] != admin {
		t.Errorf("container ports %v, want proxy %d and admin %d (IDEMPROXY_LISTEN_ADDR, IDEMPROXY_ADMIN_ADDR)", ports, listen, admin)
	}
	resolve := func(p string) int {
		if n, err := strconv.Atoi(p); err == nil {
			return n
		}
		return ports[p]
	}
	for _, pr := range []struct {
		what  string
		probe *httpProbe
		path  string
	}{{"readinessProbe", c.ReadinessProbe, "/readyz"}, {"livenessProbe", c.LivenessProbe, "/healthz"}} {
		if pr.probe == nil || pr.probe.HTTPGet == nil {
			t.Errorf("no %s with httpGet", pr.what)
			continue
		}
		if pr.probe.HTTPGet.Path != pr.path || resolve(pr.probe.HTTPGet.Port) != admin {
			t.Errorf("%s GETs %s on port %s, want %s on the admin port %d", pr.what, pr.probe.HTTPGet.Path, pr.probe.HTTPGet.Port, pr.path, admin)
		}
		// The kubelet's default timeout is 1 s; /readyz waits up to its
		// own bound (readyzBound) for the store before answering 503
		// with the reason: a shorter probe timeout turns a database
		// answering in 1-2 s into a failed probe, pods flapping.
		if timeout := time.Duration(max(pr.probe.TimeoutSeconds, 1)) * time.Second; pr.path == "/readyz" && timeout <= readyzBound {
			t.Errorf("%s timeoutSeconds %d, want more than /readyz's own bound %s", pr.what, pr.probe.TimeoutSeconds, readyzBound)
		}
	}
	if !subset(m.service.Selector, d.Template.Metadata.Labels) {
		t.Errorf("the Service selects %v, the pods are %v", m.service.Selector, d.Template.Metadata.Labels)
	}
	if len(m.service.Ports) != 1 || resolve(m.service.Ports[0].TargetPort) != listen {
		t.Errorf("the Service's ports %+v, want one, to the listen port %d", m.service.Ports, listen)
	}

	// Shutdown: the kubelet's grace counts from the preStop sleep; after it
	// SIGTERM, IDEMPROXY_SHUTDOWN_GRACE of draining, and at worst one store
	// call's 5 s timeout more before the process exits. Killed sooner, running
	// operations would be left for the retry instead of finished.
	grace, err := time.ParseDuration(setting("IDEMPROXY_SHUTDOWN_GRACE"))
	if err != nil {
		t.Fatalf("IDEMPROXY_SHUTDOWN_GRACE: %v", err)
	}
	preStop := 0
	if ps := c.Lifecycle.PreStop; ps != nil && ps.Sleep != nil {
		preStop = ps.Sleep.Seconds
	}
	need := time.Duration(preStop)*time.Second + grace + 5*time.Second
	tg := 30 // Kubernetes' default
	if pod.TerminationGracePeriodSeconds != nil {
		tg = *pod.TerminationGracePeriodSeconds
	}
	if time.Duration(tg)*time.Second <= need {
		t.Errorf("terminationGracePeriodSeconds %d, want more than preStop %ds + IDEMPROXY_SHUTDOWN_GRACE %s + 5 s", tg, preStop, grace)
	}

	// The image and its lockdown (the Pod Security Standard "restricted").
	if c.Image == "" || strings.HasSuffix(c.Image, ":latest") || !strings.Contains(path.Base(c.Image), ":") && !strings.Contains(c.Image, "@sha256:") {
		t.Errorf("image %q, want a pinned tag or digest", c.Image)
	}
	sc := pod.SecurityContext
	if sc.RunAsNonRoot == nil || !*sc.RunAsNonRoot {
		t.Error("pod securityContext: want runAsNonRoot: true")
	}
	if sc.RunAsUser != nil && *sc.RunAsUser != 65532 {
		t.Errorf("runAsUser %d, the image's user is 65532", *sc.RunAsUser)
	}
	if sc.SeccompProfile.Type != "RuntimeDefault" {
		t.Errorf("seccompProfile %q, want RuntimeDefault", sc.SeccompProfile.Type)
	}
	csc := c.SecurityContext
	if csc.ReadOnlyRootFilesystem == nil || !*csc.ReadOnlyRootFilesystem {
		t.Error("container securityContext: want readOnlyRootFilesystem: true (idemproxy on PostgreSQL writes no file)")
	}
	if csc.AllowPrivilegeEscalation == nil || *csc.AllowPrivilegeEscalation {
		t.Error("container securityContext: want allowPrivilegeEscalation: false")
	}
	if !reflect.DeepEqual(csc.Capabilities.Drop, []string{"ALL"}) {
		t.Errorf("capabilities drop %v, want [ALL]", csc.Capabilities.Drop)
	}
	if lim, ok := c.Resources.Limits["memory"]; !ok || mebibytes(t, lim) < 256 {
		t.Errorf("memory limit %q, the README asks for at least 256Mi", lim)
	}
}

// Every IDEMPROXY_ variable the compose examples set is one idemproxy reads,
// each stop_grace_period outlasts IDEMPROXY_SHUTDOWN_GRACE, and idemproxy and
// its database are started again when their process dies (a restart policy;
// without one a crash or an OOM kill left the service down until someone
// noticed). imagetest runs these files; this catches a misspelt variable,
// which a run would not.
func TestComposeVariables(t *testing.T) {
	vars := configDefaults(t)
	re := regexp.MustCompile(`^compose(\..+)?\.ya?ml$`)
	entries, err := os.ReadDir(".")
	if err != nil {
		t.Fatal(err)
	}
	var files []string
	for _, e := range entries {
		if re.MatchString(e.Name()) {
			files = append(files, e.Name())
		}
	}
	if len(files) < 2 {
		t.Fatalf("compose files at the root: %v, want compose.yaml and compose.replicas.yaml", files)
	}
	// The Dockerfile's base images, by build argument, with their defaults.
	dockerfile, err := os.ReadFile("Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	bases := map[string]string{}
	for _, m := range regexp.MustCompile(`(?m)^ARG ([A-Z_]+_IMAGE)=(\S+)$`).FindAllStringSubmatch(string(dockerfile), -1) {
		bases[m[1]] = m[2]
	}
	if bases["GO_IMAGE"] == "" || bases["RUNTIME_IMAGE"] == "" {
		t.Fatalf("the Dockerfile's base image arguments %v, want GO_IMAGE and RUNTIME_IMAGE", bases)
	}
	for _, file := range files {
		raw, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		var doc struct {
			Services map[string]struct {
				Image           string            `yaml:"image"`
				Environment     map[string]string `yaml:"environment"`
				StopGracePeriod string            `yaml:"stop_grace_period"`
				Restart         string            `yaml:"restart"`
				Build           *struct {
					Args map[string]string `yaml:"args"`
				} `yaml:"build"`
			} `yaml:"services"`
		}
		if err := yaml.Unmarshal(raw, &doc); err != nil {
			t.Fatalf("%s: %v", file, err)
		}
		proxies := 0
		for name, s := range doc.Services {
			// Every image can be replaced from the shell, and every build
			// takes the Dockerfile's base images from it, defaulting to the
			// Dockerfile's own: without the arguments, `up --build` pulls
			// the public bases, and fails where no registry can be reached
			// (README, Development).
			if !regexp.MustCompile(`^\$\{[A-Z_]+_IMAGE:-[^}]+\}$`).MatchString(s.Image) {
				t.Errorf("%s: service %s: image %q, want ${<NAME>_IMAGE:-<default>}", file, name, s.Image)
			}
			if s.Build != nil {
				for arg, def := range bases {
					if want := "${" + arg + ":-" + def + "}"; s.Build.Args[arg] != want {
						t.Errorf("%s: service %s: build arg %s %q, want %q (the Dockerfile's default, replaceable from the shell)", file, name, arg, s.Build.Args[arg], want)
					}
				}
			}
			if strings.Contains(s.Image, "POSTGRES_IMAGE") && s.Restart != "unless-stopped" && s.Restart != "always" {
				t.Errorf("%s: service %s (the store): restart %q, want unless-stopped", file, name, s.Restart)
			}
			grace, set, token := "", false, false
			for k, v := range s.Environment {
				if !strings.HasPrefix(k, "IDEMPROXY_") {
					continue
				}
				set = true
				if _, ok := vars[k]; !ok {
					t.Errorf("%s: service %s sets %s, which is not one of idemproxy's variables (config.go)", file, name, k)
				}
				switch k {
				case "IDEMPROXY_SHUTDOWN_GRACE":
					grace = v
				case "IDEMPROXY_ADMIN_TOKEN_FILE":
					token = v != ""
				case "IDEMPROXY_ADMIN_TOKEN":
					t.Errorf("%s: service %s writes IDEMPROXY_ADMIN_TOKEN in the file; it is a secret, take it from a secret file (_FILE)", file, name)
				}
			}
			if !set {
				continue
			}
			proxies++
			// Every container on the network reaches the admin port (the
			// legacy app is told to, for metrics): without a token, any of
			// them resolves an unknown operation as not executed (it is
			// sent again), renews an order or discards a record.
			if !token {
				t.Errorf("%s: service %s: no IDEMPROXY_ADMIN_TOKEN_FILE: the admin API would be open to every container on the network", file, name)
			}
			if s.Restart != "unless-stopped" && s.Restart != "always" {
				t.Errorf("%s: service %s: restart %q, want unless-stopped (started again after a crash or an OOM kill)", file, name, s.Restart)
			}
			if grace == "" {
				grace = vars["IDEMPROXY_SHUTDOWN_GRACE"]
			}
			g, err1 := time.ParseDuration(grace)
			stop, err2 := time.ParseDuration(s.StopGracePeriod)
			if err1 != nil || err2 != nil || stop <= g+5*time.Second {
				t.Errorf("%s: service %s: stop_grace_period %q, want more than IDEMPROXY_SHUTDOWN_GRACE %s + 5 s", file, name, s.StopGracePeriod, grace)
			}
		}
		if proxies == 0 {
			t.Errorf("%s: no service sets an IDEMPROXY_ variable", file)
		}
	}
}

// Every sh block of the README that brings a compose file up makes, before
// that line, each secret file the compose file reads (./secrets/<name>):
// copied as it stands on a fresh clone, a block without them stops at once
// (bind source path does not exist). imagetest runs the Deploy block; the
// Development blocks are checked only here.
func TestReadmeComposeUpMakesItsSecrets(t *testing.T) {
	raw, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	secretsOf := map[string][]string{}
	for _, file := range []string{"compose.yaml", "compose.replicas.yaml"} {
		y, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range regexp.MustCompile(`(?m)^\s*file:\s*\$\{[A-Za-z0-9_]*:-\./secrets/([A-Za-z0-9_.-]+)\}`).FindAllStringSubmatch(string(y), -1) {
			secretsOf[file] = append(secretsOf[file], m[1])
		}
		if len(secretsOf[file]) == 0 {
			t.Fatalf("%s reads no secret file from ./secrets/", file)
		}
	}
	up := regexp.MustCompile(`\bcompose\b(.*)\sup(\s|$)`)
	ups := 0
	for _, block := range regexp.MustCompile("(?s)```sh\n(.*?)```").FindAllStringSubmatch(string(raw), -1) {
		made := map[string]bool{}
		for _, line := range strings.Split(strings.ReplaceAll(block[1], "\\\n", " "), "\n") {
			if strings.HasPrefix(strings.TrimSpace(line), "#") {
				continue
			}
			for _, m := range regexp.MustCompile(`>\s*secrets/([A-Za-z0-9_.-]+)`).FindAllStringSubmatch(line, -1) {
				made[m[1]] = true
			}
			m := up.FindStringSubmatch(line)
			if m == nil {
				continue
			}
			ups++
			file := "compose.yaml"
			if f := regexp.MustCompile(`-f\s+(\S+)`).FindStringSubmatch(m[1]); f != nil {
				file = f[1]
			}
			want, ok := secretsOf[file]
			if !ok {
				t.Errorf("README: %q brings up %s, which is not one of the compose files", strings.TrimSpace(line), file)
				continue
			}
			for _, s := range want {
				if !made[s] {
					t.Errorf("README: the sh block with %q does not make secrets/%s before it, which %s reads", strings.Join(strings.Fields(line), " "), s, file)
				}
			}
		}
	}
	if ups < 2 {
		t.Errorf("README: %d sh lines bring a compose file up, want at least the two examples", ups)
	}
}
