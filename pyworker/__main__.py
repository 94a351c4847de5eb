from pyvisor_worker.main import run

run()
