"""``python -m local_runtime.moto_main``: moto's server without werkzeug's access log.

werkzeug logs every request at INFO; with the output thrown away that was still about a fifth of the server's CPU in
the soak (py-spy), and moto serves the whole local stack from one process. Warnings and errors still go to stderr.
"""

import logging
import sys

from moto.server import main

if __name__ == "__main__":
    logging.getLogger("werkzeug").setLevel(logging.WARNING)
    main(sys.argv[1:])
