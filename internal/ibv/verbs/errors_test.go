package verbs

import (
	"errors"
	"strings"
	"syscall"
	"testing"

	"github.com/pegaflow/pegad/internal/ibv"
)

func TestVerbsErrMapping(t *testing.T) {
	tests := []struct {
		op       string
		errno    syscall.Errno
		kind     error // nil: no sentinel
		wantText string
	}{
		{"ibv_get_device_list", syscall.ENOSYS, ibv.ErrUnavailable, "ibv_get_device_list: function not implemented (no RDMA kernel support)"},
		{"ibv_get_device_list", syscall.ENODEV, ibv.ErrUnavailable, "no RDMA devices"},
		{"ibv_get_device_list", syscall.EACCES, ibv.ErrUnavailable, "no permission"},
		{"ibv_open_device", syscall.ENODEV, ibv.ErrNoDevice, "device removed"},
		{"ibv_open_device", syscall.EACCES, ibv.ErrUnavailable, "/dev/infiniband/uverbs"},
		{"ibv_post_send", syscall.ENOMEM, ibv.ErrQueueFull, "ibv_post_send: cannot allocate memory"},
		{"ibv_post_send", syscall.EINVAL, ibv.ErrInvalidArgument, "ibv_post_send: invalid argument"},
		{"ibv_reg_mr", syscall.ENOMEM, nil, "RLIMIT_MEMLOCK"},
		{"ibv_reg_mr", syscall.EPERM, nil, "RLIMIT_MEMLOCK"},
		{"ibv_reg_mr", syscall.EFAULT, ibv.ErrInvalidArgument, "not suitable for registration"},
		{"ibv_reg_mr", syscall.EINVAL, ibv.ErrInvalidArgument, "invalid argument"},
		{"ibv_dealloc_pd", syscall.EBUSY, ibv.ErrInvalidState, "still in use"},
		{"ibv_modify_qp", syscall.EINVAL, ibv.ErrInvalidArgument, "ibv_modify_qp"},
		{"ibv_modify_qp", syscall.EOPNOTSUPP, ibv.ErrUnavailable, "not supported"},
		{"ibv_create_qp", syscall.ENOMEM, nil, "too many QPs"},
		{"ibv_poll_cq", syscall.EIO, nil, "ibv_poll_cq: input/output error"},
		{"ibv_query_port", 0, nil, "input/output error"}, // failed without errno
	}
	for _, tc := range tests {
		t.Run(tc.op+"/"+tc.errno.Error(), func(t *testing.T) {
			err := verbsErr(tc.op, tc.errno)
			if !strings.Contains(err.Error(), tc.wantText) {
				t.Fatalf("%q does not contain %q", err, tc.wantText)
			}
			want := tc.errno
			if want == 0 {
				want = syscall.EIO
			}
			if !errors.Is(err, want) {
				t.Fatalf("%v: errors.Is(errno %v) false", err, want)
			}
			for _, s := range []error{ibv.ErrUnavailable, ibv.ErrNoDevice, ibv.ErrQueueFull, ibv.ErrInvalidArgument, ibv.ErrInvalidState} {
				if got := errors.Is(err, s); got != (s == tc.kind) {
					t.Fatalf("%v: errors.Is(%v) = %v, want %v", err, s, got, s == tc.kind)
				}
			}
			var ve *Error
			if !errors.As(err, &ve) || ve.Op != tc.op {
				t.Fatalf("%v: not an *Error for %s", err, tc.op)
			}
		})
	}
}

func TestUnavailableError(t *testing.T) {
	cause := verbsErr("ibv_get_device_list", syscall.ENOSYS)
	err := unavailable(cause.Error(), cause)
	const want = "verbs unavailable: ibv_get_device_list: function not implemented (no RDMA kernel support)"
	if err.Error() != want {
		t.Fatalf("got %q, want %q", err, want)
	}
	if !errors.Is(err, ibv.ErrUnavailable) || !errors.Is(err, syscall.ENOSYS) {
		t.Fatalf("%v: want ErrUnavailable and ENOSYS", err)
	}
	if got := errUnavailableReason(err); got != want {
		t.Fatalf("reason %q", got)
	}
	plain := unavailable("no RDMA devices found", nil)
	if !errors.Is(plain, ibv.ErrUnavailable) || plain.Error() != "verbs unavailable: no RDMA devices found" {
		t.Fatalf("%v", plain)
	}
}
