set terminal pngcairo size 900,560 font 'sans,11' noenhanced
set output 'forward_mode_sharpness.png'
set title 'Top Hessian eigenvalues during training'
set xlabel 'step'
set ylabel 'eigenvalue'
set grid
set key top right
plot 'forward_mode_sharpness.dat' index 0 with linespoints pt 7 ps 0.4 lw 2 title 'lambda_1', 'forward_mode_sharpness.dat' index 1 with linespoints pt 7 ps 0.4 lw 2 title 'lambda_2', 'forward_mode_sharpness.dat' index 2 with linespoints pt 7 ps 0.4 lw 2 title 'lambda_3'
