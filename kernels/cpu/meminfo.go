package cpu

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"os"
	"strconv"
)

// MemInfo is the host memory available without swapping and the total, in
// bytes, from /proc/meminfo (MemAvailable, MemTotal). Elsewhere than Linux it
// returns an error: the amount is unknown.
func MemInfo() (avail, total int64, err error) {
	data, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return 0, 0, fmt.Errorf("cpu: available memory unknown: %w", err)
	}
	return parseMemInfo(data)
}

// parseMemInfo reads MemAvailable and MemTotal from /proc/meminfo's lines,
// "MemAvailable:   12345678 kB".
func parseMemInfo(data []byte) (avail, total int64, err error) {
	found := 0
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		f := bytes.Fields(sc.Bytes())
		if len(f) != 3 || string(f[2]) != "kB" {
			continue
		}
		var dst *int64
		switch string(f[0]) {
		case "MemAvailable:":
			dst = &avail
		case "MemTotal:":
			dst = &total
		default:
			continue
		}
		kb, err := strconv.ParseInt(string(f[1]), 10, 64)
		if err != nil || kb < 0 || kb > 1<<53 {
			return 0, 0, fmt.Errorf("cpu: /proc/meminfo: bad line %q", sc.Text())
		}
		*dst = kb << 10
		found++
	}
	if found < 2 {
		return 0, 0, errors.New("cpu: /proc/meminfo has no MemAvailable or MemTotal")
	}
	return avail, total, nil
}

// MemInfo is the package's MemInfo: the host memory this device allocates
// from. It has the signature of the CUDA device's, so that a caller can
// compare what a model needs with what any device has.
func (d *Device) MemInfo() (free, total int64, err error) { return MemInfo() }
