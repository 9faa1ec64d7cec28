//go:build !windows

package main

import "go.uber.org/zap"

// logPlatformLimits says what this platform cannot do: nothing on unix.
func logPlatformLimits(*zap.Logger) {}
