"""Routing at internet scale, in simulation (issue 41, item 6).

  cost      what one decision costs against fleet size: full fan-out and power-of-k what-ifs
            on a fleet of several models and GPU kinds (a timing: run it alone)
  capacity  TTFT p99 by rate of full fan-out and power-of-k on one pool of unlike GPUs
  herd      K routers deciding side by side (each decision taking --decision-ms): TTFT by K

Logic in benchmarks/fleet_scale.py; every decision is production's pipeline.
"""

from benchmarks.fleet_scale_run import main

if __name__ == "__main__":
    main()
