// Command recording-cri serves a container runtime (CRI RuntimeService and
// ImageService) for a real kubelet on a machine with no container engine:
// the in-memory runtime of k8s.io/cri-client/pkg/fake, which pulls no image
// and runs nothing, plus a JSON line per RunPodSandbox and CreateContainer
// request in -record, so that tests read what a container would really have
// been given (devices, environment, mounts, CDI devices, annotations).
//
// On top of the in-memory runtime it reports the cgroupfs driver, an image
// size (kubelet refuses images of size 0: "Id or size of image ... is not
// set") and an image filesystem, and gives every container a real log file:
// the in-memory runtime leaves the log path empty, and kubelet's container
// cleanup then removes whatever "" + "*" matches in its working directory.
package main

import (
	"context"
	"flag"
	"log"
	"os"
	"os/signal"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
	"k8s.io/cri-client/pkg/fake"
	"k8s.io/cri-client/pkg/util"
)

// runtime is the in-memory runtime with its requests recorded.
type runtime struct {
	*fake.RemoteRuntime
	logDir string
	mu     sync.Mutex
	record *os.File
}

// write appends one request, as {"call": ..., "request": ...}, to the record.
func (r *runtime) write(call string, req proto.Message) {
	body, err := protojson.Marshal(req)
	if err != nil {
		log.Printf("recording-cri: encoding %s: %v", call, err)
		return
	}
	line := append([]byte(`{"call":"`+call+`","request":`), body...)
	line = append(line, "}\n"...)
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, err := r.record.Write(line); err != nil {
		log.Printf("recording-cri: writing the record: %v", err)
	}
}

func (r *runtime) RunPodSandbox(ctx context.Context, req *runtimeapi.RunPodSandboxRequest) (*runtimeapi.RunPodSandboxResponse, error) {
	r.write("RunPodSandbox", req)
	return r.RemoteRuntime.RunPodSandbox(ctx, req)
}

func (r *runtime) CreateContainer(ctx context.Context, req *runtimeapi.CreateContainerRequest) (*runtimeapi.CreateContainerResponse, error) {
	r.write("CreateContainer", req)
	resp, err := r.RemoteRuntime.CreateContainer(ctx, req)
	if err != nil {
		return nil, err
	}
	path := filepath.Join(r.logDir, resp.ContainerId+".log")
	if f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY, 0o644); err == nil {
		f.Close()
	}
	s := r.RuntimeService
	s.Lock()
	if c, ok := s.Containers[resp.ContainerId]; ok {
		c.LogPath = path
	}
	s.Unlock()
	return resp, nil
}

func newRuntime(imageFs, logDir string, record *os.File) *runtime {
	r := &runtime{RemoteRuntime: fake.NewFakeRemoteRuntime(), logDir: logDir, record: record}
	r.RuntimeService.FakeLinuxConfiguration = &runtimeapi.LinuxRuntimeConfiguration{
		CgroupDriver: runtimeapi.CgroupDriver_CGROUPFS,
	}
	r.RuntimeService.FakeStatus = &runtimeapi.RuntimeStatus{Conditions: []*runtimeapi.RuntimeCondition{
		{Type: runtimeapi.RuntimeReady, Status: true},
		{Type: runtimeapi.NetworkReady, Status: true},
	}}
	fs := []*runtimeapi.FilesystemUsage{{
		Timestamp:  time.Now().UnixNano(),
		FsId:       &runtimeapi.FilesystemIdentifier{Mountpoint: imageFs},
		UsedBytes:  &runtimeapi.UInt64Value{Value: 0},
		InodesUsed: &runtimeapi.UInt64Value{Value: 0},
	}}
	r.ImageService.FakeFilesystemUsage = fs
	r.ImageService.FakeContainerFilesystemUsage = fs
	r.ImageService.SetFakeImageSize(1 << 20)
	return r
}

func main() {
	endpoint := flag.String("endpoint", "", "the unix:// endpoint to serve")
	dir := flag.String("dir", "", "a scratch directory: image filesystem and container logs")
	recordPath := flag.String("record", "", "the file the requests are appended to")
	flag.Parse()
	if *endpoint == "" || *dir == "" || *recordPath == "" {
		log.Fatal("recording-cri: -endpoint, -dir and -record are required")
	}
	logDir := filepath.Join(*dir, "container-logs")
	if err := os.MkdirAll(logDir, 0o755); err != nil {
		log.Fatalf("recording-cri: %v", err)
	}
	record, err := os.OpenFile(*recordPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		log.Fatalf("recording-cri: opening the record %s: %v", *recordPath, err)
	}
	r := newRuntime(*dir, logDir, record)
	listener, err := util.CreateListener(*endpoint)
	if err != nil {
		log.Fatalf("recording-cri: listening on %s: %v", *endpoint, err)
	}
	server := grpc.NewServer()
	runtimeapi.RegisterRuntimeServiceServer(server, r)
	runtimeapi.RegisterImageServiceServer(server, r)
	go func() {
		if err := server.Serve(listener); err != nil {
			log.Printf("recording-cri: %v", err)
		}
	}()
	log.Printf("recording-cri: serving on %s", *endpoint)
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGTERM, syscall.SIGINT)
	<-stop
	server.Stop()
}
