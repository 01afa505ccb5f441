"""The autoscaling benchmark (issue 42): a day-shaped two-model trace through the real pipeline on
an emulated mixed fleet, autoscaled against a static fleet sized for the peak.

The benchmark lives in `benchmarks.autoscale_run` (the day: `benchmarks.autoscale_day`); this is
its command line. Run it alone (it takes the test services' lock):

    .venv/bin/python scripts/bench_autoscale.py                 # both runs, about 2 x 35 min
    .venv/bin/python scripts/bench_autoscale.py --decision-cpu  # CPU of one decision
    .venv/bin/python scripts/bench_autoscale.py --num-requests 60 --day-s 600  # a smoke run
"""

from benchmarks.autoscale_run import main

if __name__ == "__main__":
    main()
