/* A shared library without a trainrun descriptor. */
__attribute__((visibility("default"))) int not_a_train_function(void) { return 42; }
