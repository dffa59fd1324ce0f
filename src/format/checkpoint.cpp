// placeholder: being written (see format/checkpoint.h)
