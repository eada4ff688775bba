package main

import (
	"github.com/fuselm/fuselm/kernels"
	"github.com/fuselm/fuselm/kernels/cpu"
)

func cpuDevice() kernels.Device { return cpu.NewDevice() }
