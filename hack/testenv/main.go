// Command testenv runs a genuine Kubernetes control plane on loopback for
// the project's tests and demo, on machines without Docker or a kubelet:
// embedded etcd, kube-apiserver, kube-controller-manager and kube-scheduler
// built from the same release, with TLS, RBAC and leader election on.
//
// It is also a multi-call binary, so that one (long) build yields every
// Kubernetes program the project needs:
//
//	testenv [-port N] [-kubeconfig PATH] [-timeout D]   run the control plane
//	testenv kubectl ARGS...  (or invoked through a `kubectl` symlink)
//	testenv kube-apiserver|kube-controller-manager|kube-scheduler ARGS...
//
// The components run as child processes of this binary rather than in one
// process: their cobra commands each install the process-wide signal
// handler (a second installation panics), and the controller manager's
// command runs on context.Background(), so it could never be stopped
// cleanly in-process. Separate processes run the commands unmodified.
//
// When /readyz answers ok, both leader leases are held and the controllers
// have created the default ServiceAccount, it prints exactly one line,
// `READY <kubeconfig path>`, on stdout. SIGTERM or SIGINT stops everything
// and removes the temporary directory holding etcd's data and the keys.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"
	_ "time/tzdata" // CronJob time zones, as in the upstream binaries

	"github.com/spf13/cobra"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/component-base/cli"
	"k8s.io/component-base/logs"
	_ "k8s.io/component-base/logs/json/register"
	_ "k8s.io/component-base/metrics/prometheus/clientgo"
	_ "k8s.io/component-base/metrics/prometheus/version"
	kubectl "k8s.io/kubectl/pkg/cmd"
	kubectlutil "k8s.io/kubectl/pkg/cmd/util"
	apiserver "k8s.io/kubernetes/cmd/kube-apiserver/app"
	controllermanager "k8s.io/kubernetes/cmd/kube-controller-manager/app"
	scheduler "k8s.io/kubernetes/cmd/kube-scheduler/app"
)

// components are run exactly as their upstream main() runs them.
var components = map[string]func() *cobra.Command{
	"kube-apiserver":          apiserver.NewAPIServerCommand,
	"kube-controller-manager": controllermanager.NewControllerManagerCommand,
	"kube-scheduler":          func() *cobra.Command { return scheduler.NewSchedulerCommand() },
}

// The first address of the service CIDR, which the apiserver gives to the
// `kubernetes` Service.
const (
	serviceCIDR         = "10.0.0.0/24"
	kubernetesServiceIP = "10.0.0.1"
)

func main() {
	name, args := filepath.Base(os.Args[0]), os.Args[1:]
	if name != "kubectl" && len(args) > 0 {
		if _, ok := components[args[0]]; ok || args[0] == "kubectl" {
			name, args = args[0], args[1:]
		}
	}
	// The upstream commands read os.Args themselves (cobra, kubectl's
	// plugin lookup), so they get the argv they would have had.
	os.Args = append([]string{name}, args...)
	if name == "kubectl" {
		runKubectl()
		return
	}
	if newCommand, ok := components[name]; ok {
		os.Exit(cli.Run(newCommand()))
	}

	// A flag set of our own: the global one carries flags that imported
	// packages (cadvisor, klog) register, which mean nothing here.
	fs := flag.NewFlagSet("testenv", flag.ExitOnError)
	port := fs.Int("port", 0, "apiserver secure port on 127.0.0.1 (0: a free port)")
	kubeconfig := fs.String("kubeconfig", "", "where to write the admin kubeconfig (default: in the temporary directory); removed on exit")
	timeout := fs.Duration("timeout", 3*time.Minute, "how long to wait for the control plane to become ready")
	fs.Usage = func() {
		fmt.Fprintln(fs.Output(), "usage: testenv [flags]  (or: testenv kubectl|kube-apiserver|kube-controller-manager|kube-scheduler ARGS...)")
		fs.PrintDefaults()
	}
	_ = fs.Parse(args)
	if fs.NArg() > 0 {
		fs.Usage()
		os.Exit(2)
	}

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	if err := run(ctx, *port, *kubeconfig, *timeout); err != nil {
		fmt.Fprintf(os.Stderr, "testenv: %v\n", err)
		os.Exit(1)
	}
}

// runKubectl is upstream kubectl's main().
func runKubectl() {
	_, _ = logs.GlogSetter(kubectl.GetLogVerbosity(os.Args))
	if err := cli.RunNoErrOutput(kubectl.NewDefaultKubectlCommand()); err != nil {
		kubectlutil.CheckErr(err)
	}
}

func run(ctx context.Context, port int, kubeconfig string, timeout time.Duration) error {
	dir, err := os.MkdirTemp("", "testenv-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	if kubeconfig == "" {
		kubeconfig = filepath.Join(dir, "admin.kubeconfig")
	} else {
		// Its credentials die with this cluster; a stale file would only
		// lead the next client to a dead port.
		defer os.Remove(kubeconfig)
	}

	ports, err := freePorts(3)
	if err != nil {
		return err
	}
	if port == 0 {
		port = ports[2]
	}
	etcd, etcdURL, err := startEtcd(filepath.Join(dir, "etcd"), ports[0], ports[1], timeout)
	if err != nil {
		return err
	}
	defer etcd.Close()

	p, err := newPKI(dir)
	if err != nil {
		return err
	}
	server := fmt.Sprintf("https://127.0.0.1:%d", port)
	kcmConfig, schedulerConfig := p.path("controller-manager.kubeconfig"), p.path("scheduler.kubeconfig")
	for _, kc := range []struct {
		path, user string
		groups     []string
	}{
		{kubeconfig, "admin", []string{"system:masters"}},
		// The identities whose bootstrap ClusterRoles RBAC ships with.
		{kcmConfig, "system:kube-controller-manager", nil},
		{schedulerConfig, "system:kube-scheduler", nil},
	} {
		if err := p.writeKubeconfig(kc.path, server, kc.user, kc.groups...); err != nil {
			return fmt.Errorf("writing %s: %w", kc.path, err)
		}
	}
	client, err := newClient(kubeconfig)
	if err != nil {
		return err
	}

	cp := newControlPlane()
	defer cp.stop(30 * time.Second)
	if err := cp.start("kube-apiserver", apiserverFlags(p, etcdURL, port)...); err != nil {
		return err
	}
	if err := waitFor(ctx, cp, timeout, "/readyz", func(ctx context.Context) bool {
		body, err := client.Discovery().RESTClient().Get().AbsPath("/readyz").DoRaw(ctx)
		return err == nil && string(body) == "ok"
	}); err != nil {
		return err
	}
	if err := cp.start("kube-controller-manager", controllerManagerFlags(p, kcmConfig)...); err != nil {
		return err
	}
	if err := cp.start("kube-scheduler", schedulerFlags(schedulerConfig)...); err != nil {
		return err
	}
	for _, lease := range []string{"kube-controller-manager", "kube-scheduler"} {
		if err := waitFor(ctx, cp, timeout, lease+" leader lease", func(ctx context.Context) bool {
			l, err := client.CoordinationV1().Leases(metav1.NamespaceSystem).Get(ctx, lease, metav1.GetOptions{})
			return err == nil && l.Spec.HolderIdentity != nil && *l.Spec.HolderIdentity != ""
		}); err != nil {
			return err
		}
	}
	// Pods cannot be created in a namespace before the serviceaccount
	// controller has made its `default` ServiceAccount; waiting for it here
	// saves every client from that race.
	if err := waitFor(ctx, cp, timeout, "default ServiceAccount", func(ctx context.Context) bool {
		_, err := client.CoreV1().ServiceAccounts(metav1.NamespaceDefault).Get(ctx, "default", metav1.GetOptions{})
		return err == nil
	}); err != nil {
		return err
	}

	fmt.Printf("READY %s\n", kubeconfig)
	select {
	case <-ctx.Done():
		fmt.Fprintln(os.Stderr, "testenv: shutting down")
		return nil
	case <-cp.exited:
		return cp.failure()
	}
}

// waitFor polls ready until it holds, a component dies, the deadline
// passes or we are told to stop.
func waitFor(ctx context.Context, cp *controlPlane, timeout time.Duration, what string, ready func(context.Context) bool) error {
	err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, timeout, true, func(ctx context.Context) (bool, error) {
		if err := cp.failure(); err != nil {
			return false, err
		}
		return ready(ctx), nil
	})
	switch {
	case err == nil:
		return nil
	case errors.Is(ctx.Err(), context.Canceled):
		return fmt.Errorf("interrupted while waiting for %s", what)
	case wait.Interrupted(err):
		return fmt.Errorf("control plane not ready after %s: still waiting for %s", timeout, what)
	default:
		return err
	}
}

func newClient(kubeconfig string) (*kubernetes.Clientset, error) {
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return nil, err
	}
	return kubernetes.NewForConfig(cfg)
}

// freePorts asks the kernel for n distinct free loopback ports. They are
// released before use, so another process could take one first; the
// component that loses such a race fails loudly instead of misbehaving.
func freePorts(n int) ([]int, error) {
	var ports []int
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, fmt.Errorf("finding a free port: %w", err)
		}
		defer l.Close()
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}
