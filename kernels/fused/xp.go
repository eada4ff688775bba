package fused

import (
	"os"
	"strconv"
)

// The twenty-third session's experiment knobs (not yet run on a GPU; off by
// default, to be kept as the rule or removed once measured):
// FUSELM_XP_ONE_AHEAD=N makes each moe_one block take its next ticket as a
// tile starts while more than N tickets of work remain after it;
// FUSELM_XP_ONE_SLOT_ROWS=1 makes its gate/up tiles find their rows from
// the block's choice slots instead of ranking each choice again.
var (
	xpOneAhead, _ = strconv.Atoi(os.Getenv("FUSELM_XP_ONE_AHEAD"))
	xpOneSlotRows = os.Getenv("FUSELM_XP_ONE_SLOT_ROWS") == "1"
)
