package daemon

import (
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
)

// A run's loop starts only once its first period has passed; waiting for
// it before then keeps it from ever starting, and after, lasts until it
// has returned.
func TestLaterLoop(t *testing.T) {
	var ran atomic.Int32
	early := afterPeriod(time.Hour, func() { ran.Add(1) })
	assert.False(t, early.wait(), "a loop whose period has not passed does not run")

	stop := make(chan struct{})
	late := afterPeriod(time.Millisecond, func() {
		ran.Add(1)
		<-stop
	})
	assert.Eventually(t, func() bool { return ran.Load() == 1 }, time.Second, time.Millisecond)
	returned := make(chan bool)
	go func() { returned <- late.wait() }()
	select {
	case <-returned:
		t.Fatal("wait returned while the loop still ran")
	case <-time.After(20 * time.Millisecond):
	}
	close(stop)
	assert.True(t, <-returned)
	time.Sleep(5 * time.Millisecond)
	assert.Equal(t, int32(1), ran.Load(), "the early loop never ran")
}
