"""`psgd simulate`: an event simulator of psgd's parameter-server protocols, and training along its order."""
