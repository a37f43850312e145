"""`python -m workers [celery worker options]`: one worker of the fleet (`workers.start`)."""

import sys

from workers.start import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
